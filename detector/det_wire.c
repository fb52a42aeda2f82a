/*
 * detector/det_wire.c - the detector's datagram format, its MAC and its replay window.
 *
 * Every datagram (little-endian):
 *   0 magic u32 "RKDT" | 4 version u8 | 5 type u8 | 6 ndecl u8 | 7 zero u8 | 8 job u64
 *   16 src u32 | 20 dst u32 | 24 inc u32 | 28 subject i32 | 32 origin i32 | 36 epoch u64
 *   44 seq u64 | 52 nonce u64 | 60 ndecl x {rank u32, silence_ms u32} | MAC (32 bytes)
 * The MAC is libsodium crypto_auth (HMAC-SHA-512-256) over everything before it, with a
 * key derived from the job's secret and the launch attempt's salt (rank 0 draws a fresh
 * one at every rk_init), so a datagram of an earlier attempt of the same job never
 * authenticates in a later one; the job id (derived from the secret alone) tells a stray
 * packet of another job from a forgery or an old attempt's packet. A packet is acted on only if it is the right
 * size, magic, version and job, authentic, addressed to this worker, from a slot of this
 * job, well formed, and not a replay (per-sender window of 64 sequence numbers, updated
 * only after the MAC checked). Anything else is dropped and counted, never acted on.
 *
 * A DEATH datagram is sent by the sender's parent (det_parent.c) in the sender's name, with
 * sequence numbers from DETW_PARENT_SEQ up, which the sender itself never reaches: it is
 * bound to the launch attempt by the MAC key like any datagram, to its receiver by dst,
 * and a copy of it replayed to the same receiver falls in the window (DETW_REPLAY).
 */
#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "det_internal.h"

static void put32(uint8_t *b, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *b, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *b)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | b[i];
    return v;
}

static uint64_t get64(const uint8_t *b)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | b[i];
    return v;
}

int det_key_from_secret(const char *hex, uint8_t key[DET_KEY_BYTES])
{
    if (!hex || strlen(hex) != 2 * DET_KEY_BYTES)
        return RK_E_OPTION;
    for (int i = 0; i < DET_KEY_BYTES; i++) {
        int v = 0;
        for (int j = 0; j < 2; j++) {
            char c = hex[2 * i + j];
            int x = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (x < 0)
                return RK_E_OPTION;
            v = v << 4 | x;
        }
        key[i] = (uint8_t)v;
    }
    return 0;
}

int det_key_random(uint8_t key[DET_KEY_BYTES])
{
    if (sodium_init() < 0)
        return rk__fail(RK_SUB_DET, RK_LOG_ERROR, RK_E_INTERNAL, "detector: libsodium failed to initialize");
    randombytes_buf(key, DET_KEY_BYTES);
    return 0;
}

int detw_init(detw *w, const uint8_t key[DET_KEY_BYTES], const uint8_t salt[DET_KEY_BYTES], int nslots,
              int self)
{
    memset(w, 0, sizeof(*w));
    if (sodium_init() < 0)
        return rk__fail(RK_SUB_DET, RK_LOG_ERROR, RK_E_INTERNAL, "detector: libsodium failed to initialize");
    static const char mac_ctx[] = "rekindle det v2 mac", job_ctx[] = "rekindle det v1 job";
    uint8_t job[8], msg[sizeof(mac_ctx) - 1 + DET_KEY_BYTES];
    memcpy(msg, mac_ctx, sizeof(mac_ctx) - 1);
    memcpy(msg + sizeof(mac_ctx) - 1, salt, DET_KEY_BYTES);
    crypto_generichash(w->mac_key, sizeof(w->mac_key), msg, sizeof(msg), key, DET_KEY_BYTES);
    crypto_generichash(job, sizeof(job), (const uint8_t *)job_ctx, sizeof(job_ctx) - 1, key, DET_KEY_BYTES);
    w->job = get64(job);
    w->nslots = nslots;
    w->self = self;
    w->rx_top = calloc((size_t)nslots, sizeof(*w->rx_top));
    w->rx_win = calloc((size_t)nslots, sizeof(*w->rx_win));
    if (!w->rx_top || !w->rx_win) {
        detw_fini(w);
        return -ENOMEM;
    }
    return 0;
}

void detw_fini(detw *w)
{
    free(w->rx_top);
    free(w->rx_win);
    sodium_memzero(w->mac_key, sizeof(w->mac_key));
    w->rx_top = w->rx_win = NULL;
}

size_t detw_encode(detw *w, const detm *m, uint8_t *buf)
{
    memset(buf, 0, DETW_HDR);
    put32(buf + 0, DETW_MAGIC);
    buf[4] = DETW_VERSION;
    buf[5] = (uint8_t)m->type;
    buf[6] = (uint8_t)m->ndecl;
    put64(buf + 8, w->job);
    put32(buf + 16, (uint32_t)m->src);
    put32(buf + 20, (uint32_t)m->dst);
    put32(buf + 24, m->inc);
    put32(buf + 28, (uint32_t)m->subject);
    put32(buf + 32, (uint32_t)m->origin);
    put64(buf + 36, m->epoch);
    put64(buf + 44, ++w->tx_seq);
    put64(buf + 52, m->nonce);
    size_t n = DETW_HDR;
    for (int i = 0; i < m->ndecl; i++, n += 8) {
        put32(buf + n, m->decl[i].rank);
        put32(buf + n + 4, m->decl[i].silence_ms);
    }
    crypto_auth(buf + n, buf, n, w->mac_key);
    return n + DETW_MAC;
}

static bool slot_ok(const detw *w, int32_t r, bool none_ok)
{
    return (none_ok && r == -1) || (r >= 0 && r < w->nslots);
}

int detw_decode(detw *w, const uint8_t *buf, size_t len, detm *m)
{
    if (len < DETW_HDR + DETW_MAC)
        return DETW_SHORT;
    if (len > DETW_MAX)
        return DETW_OVERSIZE;
    if (get32(buf) != DETW_MAGIC)
        return DETW_BADMAGIC;
    if (buf[4] != DETW_VERSION)
        return DETW_BADVERSION;
    if (get64(buf + 8) != w->job)
        return DETW_BADJOB;
    size_t ndecl = buf[6];
    if (ndecl > DETM_MAX_DECL || len != DETW_HDR + 8 * ndecl + DETW_MAC)
        return DETW_MALFORMED;
    if (crypto_auth_verify(buf + len - DETW_MAC, buf, len - DETW_MAC, w->mac_key) != 0)
        return DETW_BADMAC;
    int32_t src = (int32_t)get32(buf + 16), dst = (int32_t)get32(buf + 20);
    if (!slot_ok(w, src, false))
        return DETW_NONMEMBER;
    memset(m, 0, sizeof(*m));
    m->type = buf[5];
    m->src = src;
    m->dst = dst;
    m->inc = get32(buf + 24);
    m->subject = (int32_t)get32(buf + 28);
    m->origin = (int32_t)get32(buf + 32);
    m->epoch = get64(buf + 36);
    uint64_t seq = get64(buf + 44);
    m->nonce = get64(buf + 52);
    m->ndecl = (int)ndecl;
    for (size_t i = 0; i < ndecl; i++) {
        m->decl[i].rank = get32(buf + DETW_HDR + 8 * i);
        m->decl[i].silence_ms = get32(buf + DETW_HDR + 8 * i + 4);
        if (m->decl[i].rank >= (uint32_t)w->nslots)
            return DETW_MALFORMED;
    }
    if (m->type < DETM_HB || m->type >= DETM_TYPE_MAX || dst != w->self || buf[7] != 0 || seq == 0 ||
        !slot_ok(w, m->subject, true) || !slot_ok(w, m->origin, true))
        return DETW_MALFORMED;
    /* a DEATH comes from src's parent, numbered apart, and speaks of src alone */
    if ((seq >= DETW_PARENT_SEQ) != (m->type == DETM_DEATH) ||
        (m->type == DETM_DEATH && (m->subject != src || m->ndecl != 0)))
        return DETW_MALFORMED;
    /* replay window: accept each sequence number of a sender once */
    uint64_t *top = &w->rx_top[src], *win = &w->rx_win[src];
    if (seq > *top) {
        uint64_t shift = seq - *top;
        *win = shift >= 64 ? 1 : (*win << shift) | 1;
        *top = seq;
        return DETW_OK;
    }
    uint64_t back = *top - seq;
    if (back >= 64 || (*win >> back) & 1)
        return DETW_REPLAY;
    *win |= 1ull << back;
    return DETW_OK;
}

void detw_count(det_stats *s, int verdict, size_t len)
{
    s->rx_pkts++;
    s->rx_bytes += len;
    switch (verdict) {
    case DETW_OK: s->rx_ok++; break;
    case DETW_SHORT: s->drop_short++; break;
    case DETW_OVERSIZE: s->drop_oversize++; break;
    case DETW_BADMAGIC: s->drop_magic++; break;
    case DETW_BADVERSION: s->drop_version++; break;
    case DETW_BADJOB: s->drop_job++; break;
    case DETW_BADMAC: s->drop_mac++; break;
    case DETW_REPLAY: s->drop_replay++; break;
    case DETW_NONMEMBER: s->drop_nonmember++; break;
    default: s->drop_malformed++; break;
    }
}
