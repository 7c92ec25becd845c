/*
 * fuzz.h - helpers shared by the libFuzzer harnesses (tests/fuzz, docs/fuzzing.md).
 *
 * A harness that must fail loudly on a broken invariant calls FUZZ_CHECK: abort() is what
 * libFuzzer records as a crash, with the input that caused it.
 */
#ifndef DG_FUZZ_H
#define DG_FUZZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_CHECK(cond)                                                                        \
	do {                                                                                    \
		if (!(cond)) {                                                                  \
			fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, #cond); \
			abort();                                                                \
		}                                                                               \
	} while (0)

/* Consumes the input front to back; reads past the end give zeros, so every input is a
 * complete program for a harness that interprets it as a sequence of operations. */
struct fz {
	const uint8_t *p;
	size_t n;
};

static inline bool fz_more(const struct fz *f) { return f->n > 0; }

static inline uint8_t fz_u8(struct fz *f)
{
	if (!f->n)
		return 0;
	f->n--;
	return *f->p++;
}

static inline uint16_t fz_u16(struct fz *f)
{
	uint16_t hi = fz_u8(f);
	return (uint16_t)(hi << 8 | fz_u8(f));
}

static inline uint32_t fz_u32(struct fz *f)
{
	uint32_t hi = fz_u16(f);
	return hi << 16 | fz_u16(f);
}

/* Up to want bytes in place; *got says how many there were. */
static inline const uint8_t *fz_bytes(struct fz *f, size_t want, size_t *got)
{
	const uint8_t *p = f->p;
	*got = want < f->n ? want : f->n;
	f->p += *got;
	f->n -= *got;
	return p;
}

/* libFuzzer's own mutator, for the custom mutators that mutate a part and fix up the rest. */
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

#endif
