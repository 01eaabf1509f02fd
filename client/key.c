// SPDX-License-Identifier: MIT
/*
 * key.c - page keys: the SHA-256 chain over token ids (docs/protocol.md, section 5).
 *
 *   key_0 = SHA256(le32(t_0) || le32(t_1) || ...)               first page
 *   key_i = SHA256(key_{i-1} || le32(t_0) || le32(t_1) || ...)  every later page
 *
 * which is bit for bit SGLang HiCache's get_hash_str(token_ids, prior_hash): the parent's 32 raw
 * bytes (Python's bytes.fromhex(prior_hash)), then each token as 4 little-endian bytes.
 *
 * It uses libcrypto's SHA256_Init/Update/Final rather than EVP: the context lives on the stack,
 * so there is no allocation and no failure path, which a function that returns a key by value
 * needs (an EVP_MD_CTX can fail to allocate). OpenSSL 3 marks these deprecated but keeps them,
 * with the same SHA-NI/AVX2 code underneath; OPENSSL_SUPPRESS_DEPRECATED says we know.
 *
 * Pure function: no client, no lock, safe from any thread.
 */
#define OPENSSL_SUPPRESS_DEPRECATED
#include <endian.h>
#include <openssl/sha.h>
#include <string.h>

#include "api.h"

_Static_assert(SHA256_DIGEST_LENGTH == sizeof(kvb_key), "a key is one SHA-256 digest");

kvb_key kvb_key_chain(const kvb_key *parent, const uint32_t *tokens, size_t ntokens)
{
	SHA256_CTX ctx;
	kvb_key key;

	if (!tokens)
		ntokens = 0;
	SHA256_Init(&ctx);
	if (parent)
		SHA256_Update(&ctx, parent->b, sizeof(parent->b));
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	/* The token array already is the little-endian byte string: hash it in place. */
	SHA256_Update(&ctx, tokens, ntokens * sizeof(*tokens));
#else
	for (size_t i = 0; i < ntokens;) {
		uint32_t le[64];
		size_t n = ntokens - i < 64 ? ntokens - i : 64;

		for (size_t j = 0; j < n; j++)
			le[j] = htole32(tokens[i + j]);
		SHA256_Update(&ctx, le, n * sizeof(le[0]));
		i += n;
	}
#endif
	SHA256_Final(key.b, &ctx);
	return key;
}

/*
 * EAGLE (bigram) keys: SGLang hashes position i of a bigram page as the pair (t[i], t[i+1]),
 * two little-endian u32s, so npos positions read npos + 1 tokens. Pairs are built in a small
 * stack buffer and hashed a chunk at a time: no allocation, no failure path.
 */
kvb_key kvb_key_chain_eagle(const kvb_key *parent, const uint32_t *tokens, size_t npos)
{
	SHA256_CTX ctx;
	uint32_t pairs[128];
	kvb_key key;

	if (!tokens)
		npos = 0;
	SHA256_Init(&ctx);
	if (parent)
		SHA256_Update(&ctx, parent->b, sizeof(parent->b));
	for (size_t i = 0; i < npos;) {
		size_t n = npos - i < 64 ? npos - i : 64;

		for (size_t j = 0; j < n; j++) {
			pairs[2 * j] = htole32(tokens[i + j]);
			pairs[2 * j + 1] = htole32(tokens[i + j + 1]);
		}
		SHA256_Update(&ctx, pairs, n * 2 * sizeof(pairs[0]));
		i += n;
	}
	SHA256_Final(key.b, &ctx);
	return key;
}
