/*
 * tests/test_detector_wire.c - what the failure detector (detector/) sends and reports,
 * apart from its protocol: "wire", the datagram format, MAC, replay window and key parsing
 * (det_wire.c) and the death report of a worker's parent (det_parent.c, P1-P4); "proc",
 * det_proc_ending on real processes (det_parent.c P5). The protocol state machine:
 * tests/test_detector.c; real workers: tests/test_detector_proc.c.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../detector/det_internal.h"
#include "harness.h"

#define MS 1000000LL

/* ---- wire ----------------------------------------------------------------------------------- */

static const uint8_t key1[DET_KEY_BYTES] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
static const uint8_t key2[DET_KEY_BYTES] = {9, 8, 7};
static const uint8_t salt[DET_KEY_BYTES] = {4, 4, 4};

START_TEST(wire_roundtrip_and_rejects)
{
    detw tx, rx, other;
    th_assert_rc(detw_init(&tx, key1, salt, 8, 2), 0);
    th_assert_rc(detw_init(&rx, key1, salt, 8, 3), 0);
    th_assert_rc(detw_init(&other, key2, salt, 8, 2), 0);
    detm m = {.type = DETM_PING_REQ, .src = 2, .dst = 3, .inc = 7, .epoch = 9, .subject = 5, .origin = 2,
              .nonce = 0xabcdef, .ndecl = 2};
    m.decl[0] = (detm_decl){4, 321};
    m.decl[1] = (detm_decl){6, 0xffffffffu};
    uint8_t buf[DETW_MAX + 16], copy[DETW_MAX + 16];
    size_t n = detw_encode(&tx, &m, buf);
    ck_assert_uint_eq(n, DETW_HDR + 16 + DETW_MAC);
    memcpy(copy, buf, n);
    detm got;
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_OK);
    ck_assert_int_eq(got.type, m.type);
    ck_assert_int_eq(got.subject, 5);
    ck_assert_uint_eq(got.nonce, 0xabcdef);
    ck_assert_uint_eq(got.decl[1].silence_ms, 0xffffffffu);
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_REPLAY); /* the same datagram again */
    th_assert_rc(detw_decode(&rx, buf, 10, &got), DETW_SHORT);
    th_assert_rc(detw_decode(&rx, buf, DETW_MAX + 1, &got), DETW_OVERSIZE);
    copy[70] ^= 1; /* a flipped bit in a declaration */
    th_assert_rc(detw_decode(&rx, copy, n, &got), DETW_BADMAC);
    n = detw_encode(&other, &m, buf); /* another job's key */
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_BADJOB);
    n = detw_encode(&tx, &m, buf);
    buf[4] = DETW_VERSION + 1;
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_BADVERSION);
    buf[0] = 'X';
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_BADMAGIC);
    m.dst = 4; /* authentic but for another worker */
    n = detw_encode(&tx, &m, buf);
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_MALFORMED);
    m.dst = 3;
    m.subject = 8; /* out of the job's slots */
    n = detw_encode(&tx, &m, buf);
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_MALFORMED);
    m.subject = 5;
    m.src = 9;
    n = detw_encode(&tx, &m, buf);
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_NONMEMBER);
    /* random garbage never passes, never crashes */
    uint64_t r = 88172645463325252ull;
    for (int i = 0; i < 20000; i++) {
        size_t len = (size_t)(r % (DETW_MAX + 8));
        for (size_t j = 0; j < len; j++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            buf[j] = (uint8_t)r;
        }
        if (i % 3 == 0 && len >= 16) { /* right magic, version and job: must fail the MAC */
            memcpy(buf, copy, 16);
        }
        ck_assert_int_ne(detw_decode(&rx, buf, len, &got), DETW_OK);
    }
    det_stats st = {0};
    detw_count(&st, DETW_BADMAC, 100);
    detw_count(&st, DETW_OK, 92);
    ck_assert_uint_eq(st.drop_mac, 1);
    ck_assert_uint_eq(st.rx_ok, 1);
    ck_assert_uint_eq(st.rx_bytes, 192);
    detw_fini(&tx);
    detw_fini(&rx);
    detw_fini(&other);
}
END_TEST

START_TEST(wire_replay_window_reorder)
{
    detw tx, rx;
    th_assert_rc(detw_init(&tx, key1, salt, 4, 0), 0);
    th_assert_rc(detw_init(&rx, key1, salt, 4, 1), 0);
    detm m = {.type = DETM_HB, .src = 0, .dst = 1, .subject = -1, .origin = -1};
    uint8_t b[100][DETW_MAX];
    size_t n[100];
    for (int i = 0; i < 100; i++)
        n[i] = detw_encode(&tx, &m, b[i]);
    detm got;
    th_assert_rc(detw_decode(&rx, b[50], n[50], &got), DETW_OK);
    th_assert_rc(detw_decode(&rx, b[40], n[40], &got), DETW_OK);    /* late, in the window */
    th_assert_rc(detw_decode(&rx, b[40], n[40], &got), DETW_REPLAY);
    th_assert_rc(detw_decode(&rx, b[60], n[60], &got), DETW_OK);
    th_assert_rc(detw_decode(&rx, b[50], n[50], &got), DETW_REPLAY);
    th_assert_rc(detw_decode(&rx, b[55], n[55], &got), DETW_OK);
    th_assert_rc(detw_decode(&rx, b[99], n[99], &got), DETW_OK);
    th_assert_rc(detw_decode(&rx, b[20], n[20], &got), DETW_REPLAY); /* too old */
    detw_fini(&tx);
    detw_fini(&rx);
}
END_TEST

/* A datagram of an earlier launch attempt of the same job (same secret, another salt)
   never authenticates: it is another attempt's MAC, not a replay the window would see. */
START_TEST(wire_earlier_attempt_rejected)
{
    static const uint8_t salt2[DET_KEY_BYTES] = {5, 5, 5};
    detw old, tx, rx;
    th_assert_rc(detw_init(&old, key1, salt, 4, 0), 0);
    th_assert_rc(detw_init(&tx, key1, salt2, 4, 0), 0);
    th_assert_rc(detw_init(&rx, key1, salt2, 4, 1), 0);
    detm m = {.type = DETM_DECL, .src = 0, .dst = 1, .subject = -1, .origin = -1, .ndecl = 1};
    m.decl[0] = (detm_decl){1, 5000}; /* "rank 1 is dead", as the earlier attempt said */
    uint8_t b[DETW_MAX];
    detm got;
    for (int i = 0; i < 100; i++) /* its sequence numbers run ahead of the new attempt's */
        detw_encode(&old, &m, b);
    size_t n = detw_encode(&old, &m, b);
    th_assert_rc(detw_decode(&rx, b, n, &got), DETW_BADMAC);
    n = detw_encode(&tx, &m, b);
    th_assert_rc(detw_decode(&rx, b, n, &got), DETW_OK);
    detw_fini(&old);
    detw_fini(&tx);
    detw_fini(&rx);
}
END_TEST

/* The parent's death report (det_parent.c) and what a receiver makes of it: authentic
   once; its replay, a forgery, a report of an earlier attempt, one numbered like the
   worker's own datagrams, or one about another rank, are dropped (P3). Nothing is
   reported after the worker's CLOSE; the pipe's end of file (the worker dying) is no CLOSE. */
static size_t recv_one(int fd, uint8_t *buf, size_t cap)
{
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    ck_assert_int_eq(poll(&pf, 1, 5000), 1);
    ssize_t n = recv(fd, buf, cap, 0);
    ck_assert_int_gt(n, 0);
    return (size_t)n;
}

START_TEST(wire_death_report_forged_or_replayed_rejected)
{
    static const uint8_t salt2[DET_KEY_BYTES] = {5, 5, 5};
    int us = socket(AF_INET, SOCK_DGRAM, 0), pfd[2];
    ck_assert_int_ge(us, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(a);
    ck_assert_int_eq(bind(us, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(getsockname(us, (struct sockaddr *)&a, &sl), 0);
    struct sockaddr_in addrs[4] = {{0}};
    addrs[1] = a; /* only slot 1 listens here: one datagram per report */
    ck_assert_int_eq(pipe(pfd), 0);
    det_parent *pp = NULL;
    th_assert_rc(det_parent_open(&pp, pfd[0], key1), 0);
    th_assert_rc(det_parent_report(pp, 9), 0); /* nothing told yet: nothing to report */
    detpar_tell_start(pfd[1], 2, 4, salt, addrs); /* what worker 2's det_start tells */
    th_assert_rc(det_parent_read(pp), 0);
    th_assert_rc(det_parent_report(pp, 9), 1);
    uint8_t good[DETW_MAX], buf[DETW_MAX];
    size_t n = recv_one(us, good, sizeof(good));
    detw rx;
    detm got;
    th_assert_rc(detw_init(&rx, key1, salt, 4, 1), 0);
    th_assert_rc(detw_decode(&rx, good, n, &got), DETW_OK);
    ck_assert_int_eq(got.type, DETM_DEATH);
    ck_assert_int_eq(got.src, 2);
    ck_assert_int_eq(got.subject, 2);
    ck_assert_uint_eq(got.inc, 9);
    detp *p = NULL;
    detp_cfg c = {.self = 1, .world = 4, .nslots = 4, .period_ns = 100 * MS, .k = 3, .nhelpers = 2, .seed = 1};
    th_assert_rc(detp_create(&p, &c, 0), 0);
    detp_recv(p, &got, MS);
    ck_assert_int_eq(detp_peer_state(p, 2), DETP_DEAD);
    det_event e;
    ck_assert_int_eq(detp_pop_event(p, &e), 1);
    ck_assert_int_eq(e.kind, DET_EV_DEAD);
    ck_assert_int_eq(e.via, DET_VIA_PARENT);
    detp_destroy(&p);
    th_assert_rc(detw_decode(&rx, good, n, &got), DETW_REPLAY); /* the same report again */
    /* forged: a MAC under another key, with the job's id copied in */
    detw forger;
    th_assert_rc(detw_init(&forger, key2, salt, 4, 2), 0);
    forger.tx_seq = DETW_PARENT_SEQ;
    detm m = {.type = DETM_DEATH, .src = 3, .dst = 1, .subject = 3, .origin = -1};
    n = detw_encode(&forger, &m, buf);
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_BADJOB);
    memcpy(buf + 8, good + 8, 8);
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_BADMAC);
    detw_fini(&forger);
    /* with the job's key but numbered as the worker's own datagrams, or about another rank */
    detw tx;
    th_assert_rc(detw_init(&tx, key1, salt, 4, 3), 0);
    n = detw_encode(&tx, &m, buf);
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_MALFORMED);
    tx.tx_seq = DETW_PARENT_SEQ;
    m.subject = 0;
    n = detw_encode(&tx, &m, buf);
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_MALFORMED);
    m = (detm){.type = DETM_HB, .src = 3, .dst = 1, .subject = -1, .origin = -1}; /* not a DEATH */
    n = detw_encode(&tx, &m, buf);
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_MALFORMED);
    detw_fini(&tx);
    /* the worker left cleanly: nothing to report */
    detpar_tell_close(pfd[1]);
    th_assert_rc(det_parent_report(pp, 0), 0);
    /* a later attempt (another salt): its report does not authenticate in this one */
    detpar_tell_start(pfd[1], 2, 4, salt2, addrs);
    th_assert_rc(det_parent_report(pp, 9), 1);
    n = recv_one(us, buf, sizeof(buf));
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_BADMAC);
    detw rx2;
    th_assert_rc(detw_init(&rx2, key1, salt2, 4, 1), 0);
    th_assert_rc(detw_decode(&rx2, buf, n, &got), DETW_OK);
    /* the pipe closes as the worker dies, before waitpid tells: the report still goes */
    close(pfd[1]);
    th_assert_rc(det_parent_read(pp), 1);
    th_assert_rc(det_parent_report(pp, 9), 1);
    n = recv_one(us, buf, sizeof(buf));
    th_assert_rc(detw_decode(&rx2, buf, n, &got), DETW_OK);
    detw_fini(&rx2);
    det_parent_close(&pp);
    ck_assert_ptr_null(pp);
    detw_fini(&rx);
    close(pfd[0]);
    close(us);
}
END_TEST

START_TEST(wire_secret_parsing)
{
    uint8_t k[DET_KEY_BYTES];
    const char *good = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF";
    th_assert_rc(det_key_from_secret(good, k), 0);
    ck_assert_uint_eq(k[0], 0x00);
    ck_assert_uint_eq(k[1], 0x11);
    ck_assert_uint_eq(k[31], 0xff);
    th_assert_rc(det_key_from_secret("00112233", k), RK_E_OPTION);
    th_assert_rc(det_key_from_secret(NULL, k), RK_E_OPTION);
    char bad[65];
    memcpy(bad, good, 65);
    bad[10] = 'g';
    th_assert_rc(det_key_from_secret(bad, k), RK_E_OPTION);
    uint8_t r1[DET_KEY_BYTES], r2[DET_KEY_BYTES];
    th_assert_rc(det_key_random(r1), 0);
    th_assert_rc(det_key_random(r2), 0);
    ck_assert(memcmp(r1, r2, sizeof(r1)) != 0);
}
END_TEST

/* det_proc_ending (det_parent.c P5), on real processes: what the wrapper of `rekindle run`
   reports before waitpid. A live child is not ending, nor a stopped one, nor one whose main
   thread alone ended (pthread_exit) while another runs; a killed one is, at the latest
   when it can be reaped (how much sooner is bench/exit_probe's to measure, not a test's). */
static void *sleeper(void *arg)
{
    (void)arg;
    sleep(30);
    return NULL;
}

static pid_t child_of(int kind)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    if (kind == 1) { /* the main thread ends alone: the process lives on */
        pthread_t t;
        if (pthread_create(&t, NULL, sleeper, NULL) != 0)
            _exit(3);
        pthread_exit(NULL);
    }
    if (kind == 2) { /* 256 MiB touched: a teardown that takes a while */
        size_t n = 256u << 20;
        char *m = malloc(n);
        if (m)
            memset(m, 1, n);
    }
    sleep(30);
    _exit(0);
}

START_TEST(proc_ending_only_for_a_process_that_is)
{
    ck_assert_int_eq(det_proc_ending(0, -1), -EINVAL);
    pid_t live = child_of(0), lone = child_of(1), big = child_of(2);
    usleep(300 * 1000); /* the threads made, the memory touched */
    ck_assert_int_eq(det_proc_ending(live, -1), 0);
    ck_assert_int_eq(det_proc_ending(lone, -1), 0); /* its main thread is a zombie, its other thread runs */
    char path[64], buf[512] = "";
    snprintf(path, sizeof(path), "/proc/%ld/stat", (long)lone);
    FILE *f = fopen(path, "r");
    ck_assert(f && fgets(buf, sizeof(buf), f));
    fclose(f);
    ck_assert_msg(strstr(buf, ") Z "), "the main thread of the lone child is not a zombie: %s", buf);
    kill(live, SIGSTOP);
    int st;
    ck_assert_int_eq(waitpid(live, &st, WUNTRACED), live);
    ck_assert(WIFSTOPPED(st));
    ck_assert_int_eq(det_proc_ending(live, -1), 0);
    /* Killed: seen ending no later than reaped (the third through its stat file kept open,
       as the wrapper reads it). */
    snprintf(path, sizeof(path), "/proc/%ld/stat", (long)big);
    int bigfd = open(path, O_RDONLY | O_CLOEXEC);
    ck_assert_int_ge(bigfd, 0);
    ck_assert_int_eq(det_proc_ending(big, bigfd), 0);
    pid_t all[3] = {live, lone, big};
    for (int i = 0; i < 3; i++) {
        kill(all[i], SIGKILL);
        for (int64_t deadline = rk__deadline_ns(10000);;) {
            ck_assert_int_ge(det_proc_ending(all[i], i == 2 ? bigfd : -1), 0);
            siginfo_t si = {0};
            if (waitid(P_PID, (id_t)all[i], &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == all[i]) {
                ck_assert_int_eq(det_proc_ending(all[i], i == 2 ? bigfd : -1), 1); /* a zombie */
                break;
            }
            ck_assert_msg(!rk__deadline_passed(deadline), "child %d not reaped in 10 s", i);
        }
        ck_assert_int_eq(waitpid(all[i], &st, 0), all[i]);
        ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    }
    close(bigfd);
}
END_TEST

static Suite *detector_wire_suite(void)
{
    Suite *s = suite_create("detector_wire");
    TCase *tc = tcase_create("wire");
    tcase_add_test(tc, wire_roundtrip_and_rejects);
    tcase_add_test(tc, wire_replay_window_reorder);
    tcase_add_test(tc, wire_secret_parsing);
    tcase_add_test(tc, wire_earlier_attempt_rejected);
    tcase_add_test(tc, wire_death_report_forged_or_replayed_rejected);
    suite_add_tcase(s, tc);

    tc = tcase_create("proc");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, proc_ending_only_for_a_process_that_is);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return th_main(detector_wire_suite());
}
