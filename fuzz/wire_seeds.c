/*
 * fuzz/wire_seeds.c - writes the seed corpus of fuzz_wire into DIR: real datagrams of
 * every message type, encoded by detw_encode with the fuzz target's key, as a member of
 * an 8-slot job sends them to slot 1 (one per file, and one file of a sequence with a
 * replay). Built with the normal compiler by `make fuzz`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../detector/det_internal.h"

static const uint8_t key[DET_KEY_BYTES] = {1, 2, 3, 4, 5, 6, 7, 8};

static void put_pkt(FILE *f, const uint8_t *p, size_t n)
{
    fputc((int)(n & 0xff), f);
    fputc((int)(n >> 8), f);
    fwrite(p, 1, n, f);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: wire_seeds DIR\n");
        return 2;
    }
    detw w;
    static const uint8_t salt[DET_KEY_BYTES] = {9, 9, 9}; /* as fuzz_wire.c */
    if (detw_init(&w, key, salt, 8, 0) != 0)
        return 1;
    uint8_t pkt[DETW_MAX];
    char path[4096];
    FILE *seq = NULL;
    snprintf(path, sizeof(path), "%s/seq", argv[1]);
    if (!(seq = fopen(path, "wb")))
        return 1;
    fputc(0, seq);
    for (int type = DETM_HB; type < DETM_TYPE_MAX; type++) {
        detm m = {.type = type, .src = 0, .dst = 1, .inc = 3, .epoch = 2, .subject = -1, .origin = -1, .nonce = 77};
        if (type == DETM_PING || type == DETM_ACK || type == DETM_PING_REQ || type == DETM_SUSPECT) {
            m.subject = 2;
            m.origin = 0;
        }
        if (type == DETM_ALIVE || type == DETM_DEATH)
            m.subject = 0;
        uint64_t own_seq = w.tx_seq;
        if (type == DETM_DEATH) /* from the sender's parent, numbered apart */
            w.tx_seq = DETW_PARENT_SEQ;
        if (type == DETM_DECL || type == DETM_DECL_ACK || type == DETM_HB) {
            m.ndecl = 2;
            m.decl[0] = (detm_decl){5, 1200};
            m.decl[1] = (detm_decl){6, 0};
        }
        size_t n = detw_encode(&w, &m, pkt);
        if (type == DETM_DEATH)
            w.tx_seq = own_seq;
        snprintf(path, sizeof(path), "%s/type-%d", argv[1], type);
        FILE *f = fopen(path, "wb");
        if (!f)
            return 1;
        fputc(0, f);
        put_pkt(f, pkt, n);
        fclose(f);
        put_pkt(seq, pkt, n);
        if (type == DETM_ACK)
            put_pkt(seq, pkt, n); /* a replay */
    }
    fclose(seq);
    detw_fini(&w);
    return 0;
}
