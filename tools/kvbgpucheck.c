// SPDX-License-Identifier: MIT
/* kvbgpucheck.c - placeholder */
#include <stdio.h>

int main(void)
{
	return 77;
}
