/*
 * fuzz/fuzz_text.c - libFuzzer target: the self-checked text files of a checkpoint, a
 * shard's manifest (shard-<r>.ok) and the commit record (commit.ok), parsed from memory.
 *
 * Input: one mode byte, then the file. Mode bit 0 clear: the bytes are the whole file, as
 * found on disk. Set: the harness closes the bytes with the right "end <XXH3-64>" line,
 * so the parser gets past its self-check and every line after the first is exercised.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <inttypes.h>
#include <stdio.h>

#include "../formats/fmt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > (1u << 20))
        return 0;
    bool close_it = data[0] & 1;
    data++, size--;
    size_t cap = size + 32;
    char *text = malloc(cap + 1), *copy = malloc(cap + 1);
    if (!text || !copy)
        abort();
    memcpy(text, data, size);
    size_t len = size;
    if (close_it)
        len += (size_t)snprintf(text + size, cap + 1 - size, "end %016" PRIx64 "\n", fmt_xxh3(text, size));
    memcpy(copy, text, len);
    fmt_manifest *m = NULL;
    if (fmt_manifest_parse("fuzz.ok", text, len, &m) == 0) {
        for (size_t i = 0; i < m->n; i++) /* every field in range, every name a string */
            if (!m->t[i].name || strlen(m->t[i].name) > FMT_MAX_NAME || m->t[i].ndim > FMT_MAX_DIMS)
                abort();
        fmt_manifest_free(&m);
    }
    fmt_commit *k = NULL;
    if (fmt_commit_parse("fuzz/commit.ok", copy, len, &k) == 0) {
        if (k->world < 1 || !k->ok || !k->h5)
            abort();
        fmt_commit_free(&k);
    }
    free(text);
    free(copy);
    return 0;
}
