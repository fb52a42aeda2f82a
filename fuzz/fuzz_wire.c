/*
 * fuzz/fuzz_wire.c - libFuzzer target: the failure detector's datagram parser
 * (detw_decode, detector/det_wire.c) and its replay window.
 *
 * Input: one mode byte, then datagrams, each a 2-byte little-endian length and its bytes,
 * all given to one receiver (slot 1 of 8) in turn. Mode bit 0 clear: as they came off the
 * network (almost all fail the MAC: the parser's checks before it). Set: the harness, a
 * member of the job, stamps each with the job id and a right MAC, so the checks after
 * the MAC (members, declarations, the replay window) are exercised too.
 */
#include <sodium.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../detector/det_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint8_t key[DET_KEY_BYTES] = {1, 2, 3, 4, 5, 6, 7, 8};
    static uint8_t pkt[DETW_MAX + 64];
    if (size < 1)
        return 0;
    bool stamp = data[0] & 1;
    data++, size--;
    detw w;
    static const uint8_t salt[DET_KEY_BYTES] = {9, 9, 9}; /* the launch attempt's */
    if (detw_init(&w, key, salt, 8, 1) != 0)
        abort();
    det_stats st;
    memset(&st, 0, sizeof(st));
    while (size >= 2) {
        size_t n = (size_t)data[0] | (size_t)data[1] << 8;
        data += 2, size -= 2;
        if (n > size)
            n = size;
        if (n > sizeof(pkt))
            n = sizeof(pkt);
        memcpy(pkt, data, n);
        data += n, size -= n;
        if (stamp && n >= DETW_HDR + DETW_MAC) {
            for (int i = 0; i < 8; i++)
                pkt[8 + i] = (uint8_t)(w.job >> (8 * i));
            crypto_auth(pkt + n - DETW_MAC, pkt, n - DETW_MAC, w.mac_key);
        }
        detm m;
        int v = detw_decode(&w, pkt, n, &m);
        if (v == DETW_OK && (m.src < 0 || m.src >= 8 || m.dst != 1 || m.ndecl > DETM_MAX_DECL ||
                             (m.type == DETM_DEATH && (m.subject != m.src || m.ndecl != 0))))
            abort(); /* accepted something its own checks forbid */
        detw_count(&st, v, n);
    }
    detw_fini(&w);
    return 0;
}
