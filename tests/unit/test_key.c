// SPDX-License-Identifier: MIT
/*
 * test_key.c - kvb_key_chain() against fixed vectors and against Python's hashlib.
 *
 * The vectors were computed with the reference below (SGLang HiCache's get_hash_str) and are
 * published in docs/protocol.md; an engine that reimplements the chain can check itself against
 * the same table:
 *
 *   def chain(prior, toks):
 *       h = hashlib.sha256()
 *       if prior: h.update(bytes.fromhex(prior))
 *       for t in toks: h.update(t.to_bytes(4, 'little'))
 *       return h.hexdigest()
 *
 * test_key_python runs that reference live over random pages and is skipped (not failed) on a
 * machine without python3.
 *
 * EAGLE (bigram) vectors (kvb_key_chain_eagle) were computed by SGLang 0.5.23's own code: its
 * get_hash_str and RadixKey(..., is_bigram=True) taken from the wheel's source, over the
 * native module built from the wheel's srt/mem_cache/cpp_utils/hash_binding.cpp (what SGLang's
 * loader compiles at run time). Position i of a bigram page hashes (t[i], t[i+1]) as two le32:
 *
 *   def eagle(prior, toks):           # toks: the page's npos tokens and the one after it
 *       h = hashlib.sha256()
 *       if prior: h.update(bytes.fromhex(prior))
 *       for a, b in zip(toks, toks[1:]): h.update(a.to_bytes(4, 'little') + b.to_bytes(4, 'little'))
 *       return h.hexdigest()
 *
 * test_key_eagle_python runs that reference live (skipped without python3).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvbroker.h"

#define P0 "fea7b32778ecbdd7adee1941e98c89cf96bbc762f5f1beb0be24e36a456fbbc5"
#define P1 "1617a7384eff5e9135098c24794739af884859cdb17c1a61a834e8d6ac997351"
#define EMPTY "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define EMPTY_CHAINED "6f6613b4cd1094895e3add0b9dde76b06983a6998d39babfe20d1e8096460fe5"
#define BIG "9e17c443f42e193b50bc3b183c4d4905016292848388ca0ae39c2a9d6fb19f20"
#define BIG_CHAINED "aeaa35ed49630f5df777f26819e3e8492cdf12f0c30c04e6712acaddebc3d18a"
#define SINGLE "e8a4b2ee7ede79a3afb332b5b6cc3d952a65fd8cffb897f5d18016577c33d7cc"

/* SGLang get_hash_str(RadixKey(array("q", raw), is_bigram=True), prior) */
#define EG1 "f721fe42aac11dcbfd1a17f24cc5765a0d5b6bc264d1c0b6581d775a7344c11f" /* [1..5] */
#define EG2 "c35ad698917936a474f7e55f3a4855eaee20585cd0bf156b1ae3a62666ba7220" /* EG1, [5..9] */
#define EG_BIG "cee38e1f701d4ab1c28671ad5fe29cc974c2375a36274d6f8b0a7f28ce3786c7"
#define EG_EMPTY_CHAINED "66657ee168fdc3199b365c7d70c65de4323198e0af0b060c15e5505aadec32ef"
#define EG_LONG "d73ed1868af6e791c8a200db26eeb04a02a890d75c1d1c6999ad2222dfb96622"
/* The same tool on a plain key [1, 2, 3, 4], cross-checking the harness against kvb_key_chain. */
#define SGL_PLAIN "cf97adeedb59e05bfd73a2b4c2a8885708c4f4f70c84c64b27120e72ab733b72"

static void to_hex(const kvb_key *k, char out[65])
{
	for (int i = 0; i < 32; i++)
		snprintf(out + 2 * i, 3, "%02x", k->b[i]);
}

static void assert_key(const kvb_key *k, const char *hex)
{
	char got[65];

	to_hex(k, got);
	assert_string_equal(got, hex);
}

static void test_key_first_page(void **state)
{
	uint32_t t[64];
	kvb_key k;

	(void)state;
	for (uint32_t i = 0; i < 64; i++)
		t[i] = i;
	k = kvb_key_chain(NULL, t, 64);
	assert_key(&k, P0);
}

static void test_key_second_page(void **state)
{
	uint32_t t[64];
	kvb_key k0, k1;

	(void)state;
	for (uint32_t i = 0; i < 64; i++)
		t[i] = i;
	k0 = kvb_key_chain(NULL, t, 64);
	for (uint32_t i = 0; i < 64; i++)
		t[i] = 64 + i;
	k1 = kvb_key_chain(&k0, t, 64);
	assert_key(&k1, P1);
	/* The parent is an input, not state: the same call again gives the same key. */
	k1 = kvb_key_chain(&k0, t, 64);
	assert_key(&k1, P1);
}

static void test_key_empty_page(void **state)
{
	uint32_t t[64];
	kvb_key k0, k;

	(void)state;
	k = kvb_key_chain(NULL, NULL, 0);
	assert_key(&k, EMPTY); /* SHA-256 of nothing */
	k = kvb_key_chain(NULL, t, 0);
	assert_key(&k, EMPTY);
	for (uint32_t i = 0; i < 64; i++)
		t[i] = i;
	k0 = kvb_key_chain(NULL, t, 64);
	k = kvb_key_chain(&k0, NULL, 0);
	assert_key(&k, EMPTY_CHAINED); /* SHA-256 of the parent's 32 bytes */
}

static void test_key_null_tokens_are_empty(void **state)
{
	kvb_key k;

	(void)state;
	/* Documented: tokens == NULL hashes no tokens whatever ntokens says, never faults. */
	k = kvb_key_chain(NULL, NULL, 5);
	assert_key(&k, EMPTY);
}

static void test_key_large_tokens(void **state)
{
	const uint32_t t[] = {0xffffffffu, 0x80000000u, 0x7fffffffu, 1, 0};
	uint32_t d[16];
	kvb_key k, k2;

	(void)state;
	k = kvb_key_chain(NULL, t, 5);
	assert_key(&k, BIG);
	for (int i = 0; i < 16; i++)
		d[i] = 0xdeadbeefu;
	k2 = kvb_key_chain(&k, d, 16);
	assert_key(&k2, BIG_CHAINED);
}

static void test_key_single_token(void **state)
{
	const uint32_t t = 42;
	kvb_key k;

	(void)state;
	k = kvb_key_chain(NULL, &t, 1);
	assert_key(&k, SINGLE);
}

static void test_key_order_matters(void **state)
{
	const uint32_t a[] = {1, 2}, b[] = {2, 1};
	kvb_key ka, kb, kc;

	(void)state;
	ka = kvb_key_chain(NULL, a, 2);
	kb = kvb_key_chain(NULL, b, 2);
	assert_memory_not_equal(ka.b, kb.b, 32);
	/* Chaining is not concatenation of token lists under one hash: parent bytes come first. */
	kc = kvb_key_chain(&ka, b, 2);
	assert_memory_not_equal(kc.b, ka.b, 32);
}

static int have_python3(void)
{
	return system("command -v python3 >/dev/null 2>&1") == 0;
}

#define PY_PAGES 5

static void test_key_python(void **state)
{
	static const char script[] = "import hashlib, sys\n"
				     "prior = None\n"
				     "for line in sys.argv[1:]:\n"
				     "    h = hashlib.sha256()\n"
				     "    if prior: h.update(bytes.fromhex(prior))\n"
				     "    for t in line.split(','):\n"
				     "        if t: h.update(int(t).to_bytes(4, 'little'))\n"
				     "    prior = h.hexdigest()\n"
				     "    print(prior)\n";
	/* Pages of 0, 1, 7, 64 and 512 tokens: empty, tiny, odd, typical, long. */
	static const size_t sizes[PY_PAGES] = {64, 1, 7, 0, 512};
	char path[] = "/tmp/kvb_test_key_XXXXXX";
	uint32_t toks[512];
	char *cmd, line[128];
	size_t cap = 64 * 1024, len;
	kvb_key k, prev;
	const kvb_key *parent = NULL;
	unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
	FILE *f;
	int fd;

	(void)state;
	if (!have_python3()) {
		skip();
		return;
	}
	fd = mkstemp(path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, script, sizeof(script) - 1), (ssize_t)(sizeof(script) - 1));
	close(fd);

	cmd = malloc(cap);
	assert_non_null(cmd);
	len = (size_t)snprintf(cmd, cap, "python3 %s", path);
	srand(seed);
	for (int p = 0; p < PY_PAGES; p++) {
		len += (size_t)snprintf(cmd + len, cap - len, " '");
		for (size_t i = 0; i < sizes[p]; i++)
			len += (size_t)snprintf(cmd + len, cap - len, "%u,",
						(unsigned)rand() * 2654435761u);
		len += (size_t)snprintf(cmd + len, cap - len, "'");
		assert_true(len < cap);
	}
	f = popen(cmd, "r");
	assert_non_null(f);

	/* Re-derive the same tokens from the same seed and compare page by page. */
	srand(seed);
	for (int p = 0; p < PY_PAGES; p++) {
		char got[65];

		for (size_t i = 0; i < sizes[p]; i++)
			toks[i] = (unsigned)rand() * 2654435761u;
		k = kvb_key_chain(parent, toks, sizes[p]);
		assert_non_null(fgets(line, sizeof(line), f));
		line[strcspn(line, "\n")] = '\0';
		to_hex(&k, got);
		if (strcmp(got, line))
			print_error("seed %u page %d: python %s, kvb %s\n", seed, p, line, got);
		assert_string_equal(got, line);
		prev = k;
		parent = &prev;
	}
	assert_int_equal(pclose(f), 0);
	unlink(path);
	free(cmd);
}

static void test_key_eagle_vectors(void **state)
{
	static const uint32_t t1[] = {1, 2, 3, 4, 5}, t2[] = {5, 6, 7, 8, 9};
	static const uint32_t seq[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
	static const uint32_t big[] = {4294967295u, 0, 123456789, 7};
	static const uint32_t plain[] = {1, 2, 3, 4};
	uint32_t lng[101];
	kvb_key k1, k2, k;

	(void)state;
	k1 = kvb_key_chain_eagle(NULL, t1, 4);
	assert_key(&k1, EG1);
	k2 = kvb_key_chain_eagle(&k1, t2, 4);
	assert_key(&k2, EG2);
	/* SGLang's page_size=4 split of one 9-token key gives the same chain: pages share a token. */
	k = kvb_key_chain_eagle(NULL, seq, 4);
	assert_key(&k, EG1);
	k = kvb_key_chain_eagle(&k, seq + 4, 4);
	assert_key(&k, EG2);
	k = kvb_key_chain_eagle(NULL, big, 3);
	assert_key(&k, EG_BIG);
	k = kvb_key_chain_eagle(&k1, NULL, 0);
	assert_key(&k, EG_EMPTY_CHAINED);
	k = kvb_key_chain_eagle(&k1, t2, 0); /* npos 0 reads nothing */
	assert_key(&k, EG_EMPTY_CHAINED);
	/* 100 positions: more than one chunk of the implementation's pair buffer. */
	for (uint32_t i = 0; i < 101; i++)
		lng[i] = (i * 7919u) % 151936u;
	k = kvb_key_chain_eagle(NULL, lng, 100);
	assert_key(&k, EG_LONG);
	k = kvb_key_chain(NULL, plain, 4);
	assert_key(&k, SGL_PLAIN);
	/* A bigram page is not the plain page of the same tokens. */
	k = kvb_key_chain(NULL, t1, 5);
	assert_memory_not_equal(k.b, k1.b, sizeof(k.b));
}

static void test_key_eagle_python(void **state)
{
	static const char script[] =
		"import hashlib, sys\n"
		"prior = None\n"
		"for line in sys.argv[1:]:\n"
		"    t = [int(x) for x in line.split(',') if x]\n"
		"    h = hashlib.sha256()\n"
		"    if prior: h.update(bytes.fromhex(prior))\n"
		"    for a, b in zip(t, t[1:]):\n"
		"        h.update(a.to_bytes(4, 'little') + b.to_bytes(4, 'little'))\n"
		"    prior = h.hexdigest()\n"
		"    print(prior)\n";
	static const size_t npos[4] = {64, 1, 130, 7};
	char path[] = "/tmp/kvb_test_eagle_XXXXXX";
	uint32_t toks[131];
	char *cmd, line[128];
	size_t cap = 64 * 1024, len;
	kvb_key k, prev;
	const kvb_key *parent = NULL;
	unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
	FILE *f;
	int fd;

	(void)state;
	if (!have_python3()) {
		skip();
		return;
	}
	fd = mkstemp(path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, script, sizeof(script) - 1), (ssize_t)(sizeof(script) - 1));
	close(fd);
	cmd = malloc(cap);
	assert_non_null(cmd);
	len = (size_t)snprintf(cmd, cap, "python3 %s", path);
	srand(seed);
	for (int p = 0; p < 4; p++) {
		len += (size_t)snprintf(cmd + len, cap - len, " '");
		for (size_t i = 0; i <= npos[p]; i++)
			len += (size_t)snprintf(cmd + len, cap - len, "%u,",
						(unsigned)rand() * 2654435761u);
		len += (size_t)snprintf(cmd + len, cap - len, "'");
		assert_true(len < cap);
	}
	f = popen(cmd, "r");
	assert_non_null(f);
	srand(seed);
	for (int p = 0; p < 4; p++) {
		char got[65];

		for (size_t i = 0; i <= npos[p]; i++)
			toks[i] = (unsigned)rand() * 2654435761u;
		k = kvb_key_chain_eagle(parent, toks, npos[p]);
		assert_non_null(fgets(line, sizeof(line), f));
		line[strcspn(line, "\n")] = '\0';
		to_hex(&k, got);
		if (strcmp(got, line))
			print_error("seed %u page %d: python %s, kvb %s\n", seed, p, line, got);
		assert_string_equal(got, line);
		prev = k;
		parent = &prev;
	}
	assert_int_equal(pclose(f), 0);
	unlink(path);
	free(cmd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_key_first_page),
		cmocka_unit_test(test_key_second_page),
		cmocka_unit_test(test_key_empty_page),
		cmocka_unit_test(test_key_null_tokens_are_empty),
		cmocka_unit_test(test_key_large_tokens),
		cmocka_unit_test(test_key_single_token),
		cmocka_unit_test(test_key_order_matters),
		cmocka_unit_test(test_key_python),
		cmocka_unit_test(test_key_eagle_vectors),
		cmocka_unit_test(test_key_eagle_python),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
