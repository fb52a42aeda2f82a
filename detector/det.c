/*
 * detector/det.c - the detector's handle: its UDP socket, its thread, and the
 * thread-safe view and event stream that recovery consumes.
 *
 * The protocol (design header: det_proto.c) is a pure state machine; this file is the thin
 * I/O around it. The thread sleeps in poll() until a datagram arrives or the protocol's
 * next deadline; then it authenticates and feeds every pending datagram (det_wire.c), runs
 * the timers, sends what the protocol queued and publishes its events. It never calls
 * MPI, never touches the disk except to append an event line, and never waits on a peer:
 * sends are non-blocking and a full socket buffer drops the datagram (a heartbeat lost).
 *
 * Locking: one mutex guards the protocol, the published view, the event queue and the
 * counters; det_seq() and det_fenced() are lock-free atomics for cheap polling.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "det_internal.h"

#define EVQ_CAP 256

struct det {
    det_cfg cfg;
    int fd;                   /* UDP socket */
    int wake_fd;              /* eventfd: wakes the thread (stop) */
    int notify_fd;            /* eventfd: readable after each change (det_wait_fd) */
    pthread_t thr;
    bool started;
    atomic_bool stop, fenced;
    atomic_uint_fast64_t seq;
    pthread_mutex_t mu;
    detp *proto;
    detw wire;
    struct sockaddr_in *addrs; /* nslots; sin_port 0: unknown */
    det_addr self_addr;
    det_view view;
    det_event evq[EVQ_CAP];
    size_t evq_head, evq_n;
    uint64_t ev_lost;
    det_stats stats;
    int64_t t_start;          /* det_start, monotonic ns */
    uint8_t key[DET_KEY_BYTES], salt[DET_KEY_BYTES]; /* det_start's: a joiner's (det_join_info) */
};

static uint64_t host_hash(void)
{
    char name[256] = "";
    gethostname(name, sizeof(name) - 1);
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const char *c = name; *c; c++)
        h = (h ^ (uint8_t)*c) * 1099511628211ull;
    return h;
}

/* Parses "a.b.c.d/n" into a network and mask (host order); false if s is not one. */
static bool parse_subnet(const char *s, uint32_t *net, uint32_t *mask)
{
    char buf[INET_ADDRSTRLEN + 4], *end = NULL;
    const char *slash = strchr(s, '/');
    if (!slash || (size_t)(slash - s) >= INET_ADDRSTRLEN)
        return false;
    memcpy(buf, s, (size_t)(slash - s));
    buf[slash - s] = '\0';
    struct in_addr a;
    long bits = strtol(slash + 1, &end, 10);
    if (inet_pton(AF_INET, buf, &a) != 1 || !slash[1] || *end || bits < 0 || bits > 32)
        return false;
    *mask = bits == 0 ? 0 : 0xffffffffu << (32 - bits);
    *net = ntohl(a.s_addr) & *mask;
    return true;
}

/* The address to bind and advertise: iface as an address, a subnet ("10.1.0.0/16": the
   first address of an UP interface inside it; the same setting then fits every host of a
   cluster) or an interface name, else the first non-loopback IPv4 of an UP interface,
   else loopback (*loop = true). */
static int pick_addr(const char *iface, struct in_addr *out, bool *loop)
{
    *loop = false;
    if (iface && inet_pton(AF_INET, iface, out) == 1) {
        *loop = (ntohl(out->s_addr) >> 24) == 127;
        return 0;
    }
    uint32_t net = 0, mask = 0;
    bool subnet = iface && parse_subnet(iface, &net, &mask);
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0)
        return rk__fail(RK_SUB_DET, RK_LOG_ERROR, -errno, "detector: getifaddrs: %s", strerror(errno));
    bool found = false;
    for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP))
            continue;
        struct in_addr a = ((struct sockaddr_in *)i->ifa_addr)->sin_addr;
        if (subnet ? (ntohl(a.s_addr) & mask) != net
                   : iface ? strcmp(i->ifa_name, iface) != 0 : (i->ifa_flags & IFF_LOOPBACK) != 0)
            continue;
        *out = a;
        *loop = (i->ifa_flags & IFF_LOOPBACK) != 0;
        found = true;
    }
    freeifaddrs(ifs);
    if (found)
        return 0;
    if (iface)
        return rk__fail(RK_SUB_DET, RK_LOG_ERROR, RK_E_OPTION,
                        "RK_DET_IFACE='%s': neither an IPv4 address, nor a subnet holding an address of an UP "
                        "interface, nor an UP interface with one", iface);
    out->s_addr = htonl(INADDR_LOOPBACK);
    *loop = true;
    RK_LOG_INFO(RK_SUB_DET, "no UP non-loopback IPv4 interface: the detector uses 127.0.0.1 (single-host jobs only)");
    return 0;
}

int det_open(det **out, const det_cfg *cfg)
{
    int rc;
    if (!out || !cfg)
        return -EINVAL;
    *out = NULL;
    int nslots = cfg->nslots ? cfg->nslots : cfg->world;
    if (cfg->world < 1 || cfg->rank < 0 || cfg->rank >= cfg->world || nslots < cfg->world ||
        nslots > DET_MAX_SLOTS || cfg->heartbeat_ms < 1)
        return rk__fail(RK_SUB_DET, RK_LOG_ERROR, -EINVAL, "det_open: rank %d world %d slots %d period %d ms",
                        cfg->rank, cfg->world, nslots, cfg->heartbeat_ms);
    det *d = calloc(1, sizeof(*d));
    if (!d)
        return -ENOMEM;
    d->cfg = *cfg;
    d->cfg.nslots = nslots;
    d->cfg.iface = NULL;
    d->fd = d->wake_fd = d->notify_fd = -1;
    if ((rc = pthread_mutex_init(&d->mu, NULL)) != 0) {
        free(d);
        return -rc;
    }
    d->addrs = calloc((size_t)nslots, sizeof(*d->addrs));
    if (!d->addrs) {
        rc = -ENOMEM;
        goto out_free;
    }
    struct in_addr ip;
    bool loop;
    if ((rc = pick_addr(cfg->iface, &ip, &loop)) != 0)
        goto out_free;
    d->fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    d->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    d->notify_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (d->fd < 0 || d->wake_fd < 0 || d->notify_fd < 0) {
        rc = rk__fail(RK_SUB_DET, RK_LOG_ERROR, -errno, "detector: socket/eventfd: %s", strerror(errno));
        goto out_close;
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr = ip, .sin_port = 0};
    socklen_t sl = sizeof(sa);
    if (bind(d->fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        getsockname(d->fd, (struct sockaddr *)&sa, &sl) != 0) {
        char a[INET_ADDRSTRLEN];
        rc = rk__fail(RK_SUB_DET, RK_LOG_ERROR, -errno, "detector: bind %s: %s",
                      inet_ntop(AF_INET, &ip, a, sizeof(a)), strerror(errno));
        goto out_close;
    }
    int rcvbuf = 1 << 20;
    setsockopt(d->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf)); /* best effort */
    d->self_addr.ipv4 = sa.sin_addr.s_addr;
    d->self_addr.port = sa.sin_port;
    d->self_addr.loopback = loop;
    d->self_addr.host_id = host_hash();
    *out = d;
    return 0;

out_close:
    if (d->fd >= 0)
        close(d->fd);
    if (d->wake_fd >= 0)
        close(d->wake_fd);
    if (d->notify_fd >= 0)
        close(d->notify_fd);
out_free:
    free(d->addrs);
    pthread_mutex_destroy(&d->mu);
    free(d);
    return rc;
}

void det_local_addr(const det *d, det_addr *out)
{
    *out = d->self_addr;
}

int det_port(const det *d)
{
    return ntohs(d->self_addr.port);
}

/* ---- the thread (mutex held in everything below) ------------------------------------- */

static const char *event_name(int kind)
{
    switch (kind) {
    case DET_EV_SUSPECT: return "suspect";
    case DET_EV_REFUTED: return "refuted";
    case DET_EV_DEAD: return "peer_dead";
    case DET_EV_LEFT: return "peer_left";
    case DET_EV_FENCED: return "fenced";
    case DET_EV_ADMIT: return "admit_asked";
    default: return "view_installed";
    }
}

static void publish(det *d, det_event *e)
{
    e->t_ns = rk__real_ns();
    if (d->evq_n == EVQ_CAP) {
        d->evq_head = (d->evq_head + 1) % EVQ_CAP;
        d->evq_n--;
        d->ev_lost++;
    }
    d->evq[(d->evq_head + d->evq_n++) % EVQ_CAP] = *e;
    detp_view(d->proto, &d->view);
    if (e->kind == DET_EV_FENCED)
        atomic_store(&d->fenced, true);
    atomic_fetch_add(&d->seq, 1);
    uint64_t one = 1;
    if (write(d->notify_fd, &one, sizeof(one)) < 0) {
        /* counter saturated: readers are already woken */
    }
    const char *name = event_name(e->kind);
    switch (e->kind) {
    case DET_EV_DEAD:
        if (e->via == DET_VIA_PARENT)
            RK_LOG_WARN(RK_SUB_DET, "peer %d declared dead: its parent saw it end: epoch %llu, %d members", e->peer,
                        (unsigned long long)e->epoch, d->view.nmembers);
        else
            RK_LOG_WARN(RK_SUB_DET, "peer %d declared dead after %.0f ms of silence: epoch %llu, %d members",
                        e->peer, e->after_ms, (unsigned long long)e->epoch, d->view.nmembers);
        RK_EVENT(d->cfg.ev, name, RK_EV_I("peer", e->peer), RK_EV_I("epoch", e->epoch),
                 RK_EV_D("after_ms", e->after_ms), RK_EV_S("via", e->via == DET_VIA_PARENT ? "parent" : "silence"));
        break;
    case DET_EV_FENCED:
        RK_LOG_ERR(RK_SUB_DET, "the other workers declared this one dead: fenced, it sends nothing more");
        RK_EVENT(d->cfg.ev, name, RK_EV_I("epoch", e->epoch));
        break;
    case DET_EV_VIEW:
        RK_EVENT(d->cfg.ev, name, RK_EV_I("epoch", e->epoch), RK_EV_I("world", d->view.nmembers));
        break;
    case DET_EV_ADMIT:
        RK_LOG_INFO(RK_SUB_DET, "spare %d asked to join the ring: epoch %llu", e->peer, (unsigned long long)e->epoch);
        RK_EVENT(d->cfg.ev, name, RK_EV_I("peer", e->peer), RK_EV_I("epoch", e->epoch));
        break;
    default:
        RK_LOG_INFO(RK_SUB_DET, "%s: peer %d (%.0f ms silent), epoch %llu", name, e->peer, e->after_ms,
                    (unsigned long long)e->epoch);
        RK_EVENT(d->cfg.ev, name, RK_EV_I("peer", e->peer), RK_EV_I("epoch", e->epoch),
                 RK_EV_D("after_ms", e->after_ms));
        break;
    }
}

static void flush(det *d)
{
    detm m;
    det_event e;
    uint8_t buf[DETW_MAX];
    while (detp_pop_send(d->proto, &m)) {
        struct sockaddr_in *to = &d->addrs[m.dst];
        if (to->sin_port == 0)
            continue; /* a spare whose address is not known yet */
        size_t n = detw_encode(&d->wire, &m, buf);
        if (sendto(d->fd, buf, n, MSG_DONTWAIT, (struct sockaddr *)to, sizeof(*to)) == (ssize_t)n) {
            d->stats.tx_pkts++;
            d->stats.tx_bytes += n;
        }
    }
    while (detp_pop_event(d->proto, &e))
        publish(d, &e);
}

static void drain(det *d, int64_t now)
{
    uint8_t buf[DETW_MAX + 64];
    detm m;
    for (int i = 0; i < 4096; i++) {
        ssize_t n = recv(d->fd, buf, sizeof(buf), MSG_DONTWAIT | MSG_TRUNC);
        if (n < 0)
            break; /* EAGAIN, or an ICMP error of an earlier send: nothing to act on */
        size_t len = (size_t)n;
        int v = len > sizeof(buf) ? DETW_OVERSIZE : detw_decode(&d->wire, buf, len, &m);
        detw_count(&d->stats, v, len);
        if (v == DETW_OK)
            detp_recv(d->proto, &m, now);
    }
}

/* A turn of the thread late by more than a period (its peers declare it dead after three
   without a beat) is logged once a second at most, with where the time went: the lock
   before the wait (held by an application thread), the wake from poll (the CPU not given
   to the thread), the lock after it, the turn's own work (a blocked write of the log or
   the event log) or the watch. t[0]: the previous turn's end; t[1]: the lock taken;
   t[2]: poll returned; t[3]: the lock taken; t[4]: the work done; t[5]: the watch done. */
static void late_turn(det *d, const int64_t t[6], int64_t asked_ms, int64_t *told)
{
    int64_t period = (int64_t)d->cfg.heartbeat_ms * 1000000, overslept = t[2] - t[1] - asked_ms * 1000000;
    int64_t late = (t[1] - t[0]) + (overslept > 0 ? overslept : 0) + (t[5] - t[2]);
    if (late <= period || t[5] - *told < 1000000000)
        return;
    *told = t[5];
    RK_LOG_WARN(RK_SUB_DET, "detector thread late by %.0f ms (the peers allow %d ms of silence): the lock took %.0f "
                "ms, poll asked %lld ms and woke after %.0f, the lock then %.0f, the turn %.0f, the watch %.0f",
                late / 1e6, 3 * d->cfg.heartbeat_ms, (t[1] - t[0]) / 1e6, (long long)asked_ms, (t[2] - t[1]) / 1e6,
                (t[3] - t[2]) / 1e6, (t[4] - t[3]) / 1e6, (t[5] - t[4]) / 1e6);
}

/* The thread's turns must come on time: on a loaded machine a normal thread's wake from
   poll can come 200-300 ms late (the CI machine, 2 cores at load ~10: its peers took that
   silence for death), where a real-time thread's comes within ~20 ms. So the thread asks
   for SCHED_RR priority 1 where the process may (root, CAP_SYS_NICE or RLIMIT_RTPRIO >= 1;
   RK_DET_RT=0 turns it off): it sleeps in poll and works microseconds a turn, so it takes
   nothing from training; elsewhere it stays as it is (said at INFO). */
static void det_priority(void)
{
    const char *e = getenv("RK_DET_RT");
    if (e && (strcmp(e, "0") == 0 || strcmp(e, "off") == 0))
        return;
    struct sched_param sp = {.sched_priority = 1};
    int rc = pthread_setschedparam(pthread_self(), SCHED_RR, &sp);
    if (rc == 0)
        RK_LOG_INFO(RK_SUB_DET, "detector thread: real-time priority (SCHED_RR 1)");
    else
        RK_LOG_INFO(RK_SUB_DET, "detector thread: no real-time priority (%s): its turns may be late on a loaded "
                    "machine", strerror(rc));
}

static void *det_thread(void *arg)
{
    det *d = arg;
    det_priority();
    int64_t told = 0, t[6];
    t[0] = rk__mono_ns();
    while (!atomic_load(&d->stop)) {
        pthread_mutex_lock(&d->mu);
        t[1] = rk__mono_ns();
        int64_t wait = detp_next_deadline(d->proto) - t[1];
        pthread_mutex_unlock(&d->mu);
        int ms = wait <= 0 ? 0 : (int)((wait + 999999) / 1000000);
        struct pollfd pf[2] = {{.fd = d->fd, .events = POLLIN}, {.fd = d->wake_fd, .events = POLLIN}};
        if (poll(pf, 2, ms) < 0 && errno != EINTR)
            break;
        if (atomic_load(&d->stop))
            break;
        t[2] = rk__mono_ns();
        pthread_mutex_lock(&d->mu);
        t[3] = rk__mono_ns();
        drain(d, t[3]); /* before the timers: a packet waiting in the buffer is a sign of life */
        detp_tick(d->proto, t[3]);
        flush(d);
        pthread_mutex_unlock(&d->mu);
        t[4] = rk__mono_ns();
        if (d->cfg.watch)
            d->cfg.watch(d->cfg.watch_arg);
        t[5] = rk__mono_ns();
        late_turn(d, t, ms, &told);
        t[0] = t[5];
    }
    return NULL;
}

int det_start(det *d, const det_addr *addrs, const uint8_t key[DET_KEY_BYTES], const uint8_t salt[DET_KEY_BYTES])
{
    int rc;
    if (!d || !addrs || !key || !salt || d->started)
        return -EINVAL;
    for (int r = 0; r < d->cfg.world; r++) {
        d->addrs[r].sin_family = AF_INET;
        d->addrs[r].sin_addr.s_addr = addrs[r].ipv4;
        d->addrs[r].sin_port = addrs[r].port;
    }
    if ((rc = detw_init(&d->wire, key, salt, d->cfg.nslots, d->cfg.rank)) != 0)
        return rc;
    uint64_t seed;
    memcpy(&seed, salt, sizeof(seed));
    detp_cfg pc = {.self = d->cfg.rank, .world = d->cfg.world, .nslots = d->cfg.nslots,
                   .period_ns = (int64_t)d->cfg.heartbeat_ms * 1000000, .k = 3, .nhelpers = 2,
                   .seed = seed ^ (uint64_t)rk__mono_ns(), .view0 = d->cfg.view0};
    d->cfg.view0 = NULL; /* the caller's */
    memcpy(d->key, key, DET_KEY_BYTES);
    memcpy(d->salt, salt, DET_KEY_BYTES);
    if ((rc = detp_create(&d->proto, &pc, rk__mono_ns())) != 0)
        goto out_wire;
    detp_view(d->proto, &d->view);
    /* The thread takes no signals: they stay the application's. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = -pthread_create(&d->thr, NULL, det_thread, d);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        rk__fail(RK_SUB_DET, RK_LOG_ERROR, rc, "detector: pthread_create: %s", strerror(-rc));
        goto out_proto;
    }
    d->started = true;
    d->t_start = rk__mono_ns();
    detpar_tell_start(d->cfg.parent_fd, d->cfg.rank, d->cfg.nslots, salt, d->addrs);
    return 0;

out_proto:
    detp_destroy(&d->proto);
out_wire:
    detw_fini(&d->wire);
    return rc;
}

void det_close(det **pd)
{
    if (!pd || !*pd)
        return;
    det *d = *pd;
    if (d->started) {
        detpar_tell_close(d->cfg.parent_fd); /* a worker that left is no news of a death */
        pthread_mutex_lock(&d->mu);
        detp_leave(d->proto, rk__mono_ns());
        flush(d);
        pthread_mutex_unlock(&d->mu);
        atomic_store(&d->stop, true);
        uint64_t one = 1;
        if (write(d->wake_fd, &one, sizeof(one)) < 0) {
            /* cannot fail for an eventfd below its maximum; stop is set anyway */
        }
        pthread_join(d->thr, NULL);
        det_stats *s = &d->stats;
        RK_LOG_INFO(RK_SUB_DET, "detector stopped: sent %llu packets, received %llu (%llu accepted; dropped: "
                    "%llu bad MAC, %llu replayed, %llu malformed)", (unsigned long long)s->tx_pkts,
                    (unsigned long long)s->rx_pkts, (unsigned long long)s->rx_ok,
                    (unsigned long long)s->drop_mac, (unsigned long long)s->drop_replay,
                    (unsigned long long)s->drop_malformed);
        RK_EVENT(d->cfg.ev, "det_stats", RK_EV_D("run_ms", rk__ms_since(d->t_start)),
                 RK_EV_I("tx_pkts", s->tx_pkts), RK_EV_I("tx_bytes", s->tx_bytes),
                 RK_EV_I("rx_pkts", s->rx_pkts), RK_EV_I("rx_bytes", s->rx_bytes), RK_EV_I("rx_ok", s->rx_ok),
                 RK_EV_I("drop_short", s->drop_short), RK_EV_I("drop_oversize", s->drop_oversize),
                 RK_EV_I("drop_magic", s->drop_magic), RK_EV_I("drop_version", s->drop_version),
                 RK_EV_I("drop_job", s->drop_job), RK_EV_I("drop_mac", s->drop_mac),
                 RK_EV_I("drop_replay", s->drop_replay), RK_EV_I("drop_malformed", s->drop_malformed),
                 RK_EV_I("drop_nonmember", s->drop_nonmember));
        detp_destroy(&d->proto);
        detw_fini(&d->wire);
    }
    close(d->fd);
    close(d->wake_fd);
    close(d->notify_fd);
    free(d->addrs);
    pthread_mutex_destroy(&d->mu);
    explicit_bzero(d->key, sizeof(d->key));
    explicit_bzero(d->salt, sizeof(d->salt));
    free(d);
    *pd = NULL;
}

/* ---- the interface for recovery --------------------------------------------------------- */

uint64_t det_seq(const det *d)
{
    return atomic_load(&((det *)d)->seq);
}

int det_wait_fd(const det *d)
{
    return d->notify_fd;
}

bool det_fenced(const det *d)
{
    return atomic_load(&((det *)d)->fenced);
}

bool det_unadmitted(const det *d)
{
    det *m = (det *)d;
    pthread_mutex_lock(&m->mu);
    bool un = m->proto && detp_unadmitted(m->proto);
    pthread_mutex_unlock(&m->mu);
    return un;
}

void det_joiner_knows(det *d, int slot, uint64_t epoch)
{
    pthread_mutex_lock(&d->mu);
    if (d->proto)
        detp_joiner_knows(d->proto, slot, epoch);
    pthread_mutex_unlock(&d->mu);
}

void det_view_get(const det *d, det_view *out)
{
    det *m = (det *)d;
    pthread_mutex_lock(&m->mu);
    *out = m->view;
    pthread_mutex_unlock(&m->mu);
}

int det_next_event(det *d, det_event *ev, uint64_t *lost)
{
    pthread_mutex_lock(&d->mu);
    int got = d->evq_n > 0;
    if (got) {
        *ev = d->evq[d->evq_head];
        d->evq_head = (d->evq_head + 1) % EVQ_CAP;
        d->evq_n--;
    }
    if (lost)
        *lost = d->ev_lost;
    pthread_mutex_unlock(&d->mu);
    return got;
}

int det_install_view(det *d, const det_view *v)
{
    if (!d || !v || !d->started)
        return -EINVAL;
    pthread_mutex_lock(&d->mu);
    int rc = detp_install_view(d->proto, v, rk__mono_ns());
    flush(d);
    pthread_mutex_unlock(&d->mu);
    return rc;
}

int det_admit(det *d, int slot)
{
    if (!d || !d->started)
        return -EINVAL;
    pthread_mutex_lock(&d->mu);
    int rc = detp_admit(d->proto, slot, rk__mono_ns());
    flush(d);
    pthread_mutex_unlock(&d->mu);
    return rc;
}

void det_stats_get(const det *d, det_stats *out)
{
    det *m = (det *)d;
    pthread_mutex_lock(&m->mu);
    *out = m->stats;
    pthread_mutex_unlock(&m->mu);
}

int det_join_info(det *d, uint8_t key[DET_KEY_BYTES], uint8_t salt[DET_KEY_BYTES], det_addr *addrs,
                  det_view *view)
{
    if (!d || !d->started)
        return -EINVAL;
    pthread_mutex_lock(&d->mu);
    memcpy(key, d->key, DET_KEY_BYTES);
    memcpy(salt, d->salt, DET_KEY_BYTES);
    for (int r = 0; r < d->cfg.nslots; r++)
        addrs[r] = (det_addr){.ipv4 = d->addrs[r].sin_addr.s_addr, .port = d->addrs[r].sin_port,
                              .loopback = d->self_addr.loopback};
    *view = d->view;
    pthread_mutex_unlock(&d->mu);
    return 0;
}

int det_set_addr(det *d, int slot, const det_addr *a)
{
    if (!d || !a || slot < 0 || slot >= d->cfg.nslots)
        return -EINVAL;
    pthread_mutex_lock(&d->mu);
    d->addrs[slot].sin_family = AF_INET;
    d->addrs[slot].sin_addr.s_addr = a->ipv4;
    d->addrs[slot].sin_port = a->port;
    struct sockaddr_in sa = d->addrs[slot];
    pthread_mutex_unlock(&d->mu);
    if (d->started)
        detpar_tell_addr(d->cfg.parent_fd, slot, &sa);
    return 0;
}
