/* SPDX-License-Identifier: MIT */
/*
 * list.h - intrusive circular doubly-linked lists (the kernel's list_head), used for the LRU
 * lists, slab lists, the session list and the request engine's wait lists. A node not on any list points at itself.
 */
#ifndef KVB_BROKER_LIST_H
#define KVB_BROKER_LIST_H

#include <stddef.h>

struct list {
	struct list *prev, *next;
};

static inline void list_init(struct list *l)
{
	l->prev = l->next = l;
}

static inline int list_empty(const struct list *l)
{
	return l->next == l;
}

static inline void list_add_head(struct list *l, struct list *n)
{
	n->next = l->next;
	n->prev = l;
	l->next->prev = n;
	l->next = n;
}

static inline void list_add_tail(struct list *l, struct list *n)
{
	list_add_head(l->prev, n);
}

static inline void list_del(struct list *n)
{
	n->prev->next = n->next;
	n->next->prev = n->prev;
	list_init(n);
}

static inline int list_linked(const struct list *n)
{
	return n->next != n;
}

/* Moves every entry of from (which ends empty) to the tail of to, in order. */
static inline void list_splice_tail(struct list *to, struct list *from)
{
	struct list *first = from->next, *last = from->prev;

	if (first == from)
		return;
	first->prev = to->prev;
	to->prev->next = first;
	last->next = to;
	to->prev = last;
	list_init(from);
}

/* Moves every entry of from (which ends empty) to the head of to, in order. */
static inline void list_splice_head(struct list *to, struct list *from)
{
	struct list *first = from->next, *last = from->prev;

	if (first == from)
		return;
	last->next = to->next;
	to->next->prev = last;
	to->next = first;
	first->prev = to;
	list_init(from);
}

#define list_entry(ptr, type, member) ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

#define list_for_each(pos, head) for (pos = (head)->next; pos != (head); pos = pos->next)

#define list_for_each_safe(pos, tmp, head)                                                         \
	for (pos = (head)->next, tmp = pos->next; pos != (head); pos = tmp, tmp = pos->next)

#endif /* KVB_BROKER_LIST_H */
