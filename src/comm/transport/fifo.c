/* Slot-FIFO transports: shared memory between processes on one host (shm) and in-process memory
 * between threads (loopback). Both move bytes through single-producer/single-consumer rings of
 * fixed-size slots; they differ only in where the rings live and how a dead peer is noticed.
 *
 * Note [Slot FIFOs]
 * For each ordered pair (s -> d) there is one ring in d's memory: `tail` is advanced by s after it
 * filled a slot (release), `head` by d after it consumed one (release). A transfer of B bytes uses
 * ceil(B / slot_bytes) slots; both sides cut the stream identically, so a RECV_REDUCE reduces
 * straight out of the slot (no extra copy) and every chunk holds whole elements (slot_bytes is a
 * multiple of 64). Waiting spins briefly, then yields, then sleeps (sl_comm_backoff) so that more
 * ranks than cores never livelock; deadlines, the abort flag and peer liveness are checked while
 * waiting. Liveness: shm peers publish their pid (kill(pid,0) + /proc state) and an aborted flag in
 * their segment header; loopback peers only the aborted flag. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_internal.h"
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

typedef struct chan {
    _Atomic uint64_t tail;
    char pad1[56];
    _Atomic uint64_t head;
    char pad2[56];
} chan;
#define CHAN_HDR 128

typedef struct seg_hdr { /* start of each shm segment / of the loopback block */
    uint64_t magic;
    atomic_int aborted[64]; /* loopback: per rank; shm: [0] only */
    int pid, nslots, n;
    size_t slot_bytes, chan_bytes;
    size_t ctl_off;      /* loopback: offset of the per-rank window control words in the block */
    uint64_t probe_addr; /* shm: address of `probe` in the owner's address space (CMA check) */
    uint64_t probe;
} seg_hdr;
#define SEG_HDR 4096
#define SEG_CTL 2048 /* shm: offset of the rank's window control words in its segment header */
_Static_assert(SEG_CTL + SL_WIN_CTL * 8 <= SEG_HDR, "window control words must fit the segment header");
#define SEG_MAGIC 0x534c464946304f31ull

typedef struct fifo_tp {
    sl_transport base;
    int loopback;
    int nslots;
    size_t slot_bytes;
    char **to;      /* [peer] ring I write (in peer's memory) */
    char **from;    /* [peer] ring I read (in my memory) */
    seg_hdr **peer; /* [peer] header holding peer's pid/aborted (shm) */
    seg_hdr *block; /* loopback shared block */
    void **maps;    /* shm: mapping per rank */
    size_t map_bytes;
    double next_check;
    unsigned spin;   /* backoff spin budget */
    size_t pull_min; /* transfers >= this many bytes are pulled single-copy (0: never) */
    size_t move_min; /* all-gather / all-to-all sources >= this many bytes are read with peer_read */
    char *pull_tmp;  /* staging for pulled RECV_REDUCE chunks (cache resident) */
    size_t nt_min;   /* slot transfers >= this many bytes store into the destination non-temporally */
    char *nt_tmp;    /* NT_BLOCK bytes: reduce here (L1), then stream out */
    char name[200];  /* shm: the communicator's segment name prefix (windows derive theirs) */
} fifo_tp;

/* Note [Non-temporal stores]
 * The destination of a large transfer (several MiB) is not read again before it has left the
 * cache, so the receiver writes it with streaming stores: that saves the read-for-ownership of every
 * destination line, a third of the memory traffic of a copy. A reduction is computed into a small
 * L1-resident block (same operands, same order: results are bitwise the same) which is then streamed
 * out. Slots themselves are written normally: the receiver reads them from the cache. */
#define NT_BLOCK (8u << 10)
void sl_comm_stream_copy(void *dst, const void *src, size_t len) {
#if defined(__x86_64__)
    char *d = dst;
    const char *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (head > len) head = len;
    memcpy(d, s, head);
    d += head, s += head, len -= head;
    for (; len >= 64; len -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)),
                e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    memcpy(d, s, len);
    _mm_sfence();
#else
    memcpy(dst, src, len);
#endif
}

/* Receiver side of one slot: copy or reduce len bytes from slot s into d (a = src operand). */
static void slot_consume(fifo_tp *t, const sl_xfer *xi, char *d, const char *a, const char *s, size_t len) {
    int nt = t->nt_min && xi->bytes >= t->nt_min;
    if (xi->kind == SL_XFER_RECV) {
        if (nt)
            sl_comm_stream_copy(d, s, len);
        else
            memcpy(d, s, len);
        return;
    }
    size_t es = sl_comm_dtype_size(xi->dt);
    if (!nt) {
        sl_comm_reduce_kernel(xi->dt, xi->op, d, a, s, len / es);
        return;
    }
    for (size_t off = 0; off < len; off += NT_BLOCK) {
        size_t k = len - off < NT_BLOCK ? len - off : NT_BLOCK;
        sl_comm_reduce_kernel(xi->dt, xi->op, t->nt_tmp, a + off, s + off, k / es);
        sl_comm_stream_copy(d + off, t->nt_tmp, k);
    }
}

/* Note [Single-copy pulls]
 * Large transfers skip the slots: the sender puts a descriptor {address, length} in one slot and
 * waits until the receiver has consumed it; the receiver copies straight from the sender's buffer
 * (shm only: process_vm_readv, Linux cross-memory attach) into
 * its destination, or in PULL_CHUNK pieces through a cache-resident buffer for RECV_REDUCE. This
 * halves the copies of a large transfer. Both sides pick the mode from the byte count alone, so
 * they always agree; shm enables it only if every rank could read a peer's probe word at startup
 * (CMA needs ptrace permission between the ranks). SUANLI_SHM_PULL_KB=0 disables it. */
#define PULL_CHUNK (256u << 10)
typedef struct pull_desc {
    uint64_t addr, len;
} pull_desc;

static sl_status pull_copy(fifo_tp *t, int peer, void *dst, uint64_t addr, size_t len) {
    if (t->loopback) {
        memcpy(dst, (const void *)(uintptr_t)addr, len);
        return SL_OK;
    }
    size_t done = 0;
    while (done < len) {
        struct iovec l = {(char *)dst + done, len - done}, r = {(void *)(uintptr_t)(addr + done), len - done};
        ssize_t k = process_vm_readv(t->peer[peer]->pid, &l, 1, &r, 1, 0);
        if (k <= 0)
            return sl_fail(SL_ERR_PEER, "rank %d: cannot read its buffer (process_vm_readv: %s)", peer,
                           k < 0 ? strerror(errno) : "short read");
        done += (size_t)k;
    }
    return SL_OK;
}

static sl_status fifo_peer_read(sl_transport *t_, int peer, void *dst, uint64_t addr, size_t len) {
    return pull_copy((fifo_tp *)t_, peer, dst, addr, len);
}

/* Receive a pulled transfer described by slot s. */
static sl_status pull_recv(fifo_tp *t, sl_xfer *xi, const char *s) {
    pull_desc d;
    memcpy(&d, s, sizeof d);
    if (d.len != xi->bytes)
        return sl_fail(SL_ERR_INTERNAL, "rank %d sent %llu bytes where %zu were expected (mismatched calls?)",
                       xi->peer, (unsigned long long)d.len, xi->bytes);
    if (xi->kind == SL_XFER_RECV) return pull_copy(t, xi->peer, xi->buf, d.addr, xi->bytes);
    size_t es = sl_comm_dtype_size(xi->dt);
    for (size_t off = 0; off < xi->bytes; off += PULL_CHUNK) {
        size_t len = xi->bytes - off < PULL_CHUNK ? xi->bytes - off : PULL_CHUNK;
        const char *src;
        if (t->loopback)
            src = (const char *)(uintptr_t)(d.addr + off);
        else {
            SL_TRY(pull_copy(t, xi->peer, t->pull_tmp, d.addr + off, len));
            src = t->pull_tmp;
        }
        sl_comm_reduce_kernel(xi->dt, xi->op, (char *)xi->buf + off, (const char *)xi->src + off, src,
                              len / es);
    }
    return SL_OK;
}

static size_t env_size(const char *name, size_t dflt, size_t lo, size_t hi) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end || x < lo || x > hi) {
        SL_LOGW("%s=%s ignored (want %zu..%zu)", name, v, lo, hi);
        return dflt;
    }
    return (size_t)x;
}

/* Note [Waiting]
 * Spin briefly (a peer that is running answers within a microsecond), then sched_yield for a long
 * while (a descheduled peer gets our core at once: this is what keeps latency low when ranks share
 * cores with each other or with other jobs), and only then sleep, so a rank waiting seconds for a
 * slow peer costs almost no CPU. Never a pure spin: more ranks than cores cannot livelock. */
#define YIELD_ITERS 20000u
/* Note [Ranks sharing a machine]
 * A host's ranks spin long only when each has a core. "Host" is the communicator's topology (hostname or
 * SUANLI_COMM_HOSTNAME), but hosts simulated on one machine (network namespaces, tests) share its CPUs
 * with the other hosts' ranks: 2 pretend hosts x 2 ranks on 2 cores spun 4096 pauses per wait while the
 * peer it waited for could not run, and an 8-byte hierarchical all-reduce took 96-165 us against 35-59 us
 * with short spins (docs/BENCHMARKS-comm.md). Communicator creation counts the ranks on this kernel (same
 * boot id) and notes the largest count here; the budget uses it when it exceeds the host's. */
static _Atomic int g_machine_ranks;
void sl_comm_note_machine_ranks(int n) {
    int cur = atomic_load(&g_machine_ranks);
    while (n > cur && !atomic_compare_exchange_weak(&g_machine_ranks, &cur, n)) {
    }
}
unsigned sl_comm_spin_budget(int local_ranks) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int m = atomic_load(&g_machine_ranks);
    if (m > local_ranks) local_ranks = m;
    return local_ranks <= cpus ? 4096u : 16u;
}
void sl_comm_backoff(unsigned *iter, unsigned spin) {
    unsigned i = (*iter)++;
    if (i < spin) {
        __builtin_ia32_pause();
    } else if (i < YIELD_ITERS) {
        sched_yield();
    } else {
        struct timespec ts = {0, i < YIELD_ITERS + 1000 ? 50000 : 200000};
        nanosleep(&ts, NULL);
    }
}

static inline char *slot_ptr(fifo_tp *t, char *ring, uint64_t k) {
    return ring + CHAN_HDR + (size_t)(k % (uint64_t)t->nslots) * t->slot_bytes;
}

static int proc_dead(int pid) {
    if (kill(pid, 0) != 0 && errno == ESRCH) return 1;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

static sl_status peer_check(fifo_tp *t, int peer) {
    if (t->loopback) {
        if (atomic_load(&t->block->aborted[peer]))
            return sl_fail(SL_ERR_PEER, "rank %d aborted its communicator", peer);
        return SL_OK;
    }
    seg_hdr *h = t->peer[peer];
    if (atomic_load(&h->aborted[0])) return sl_fail(SL_ERR_PEER, "rank %d aborted its communicator", peer);
    if (proc_dead(h->pid)) return sl_fail(SL_ERR_PEER, "rank %d (pid %d) died", peer, h->pid);
    return SL_OK;
}

static sl_status fifo_exchange(sl_transport *t_, sl_xfer *x, int n, double deadline) {
    fifo_tp *t = (fifo_tp *)t_;
    int remaining = 0;
    for (int i = 0; i < n; i++) {
        x[i].done = x[i].aux = 0;
        if (x[i].bytes) remaining++;
    }
    unsigned iter = 0;
    sl_status dead = SL_OK;
    const uint64_t ns = (uint64_t)t->nslots;
    while (remaining) {
        int progressed = 0;
        for (int i = 0; i < n; i++) {
            sl_xfer *xi = &x[i];
            if (xi->done == xi->bytes) continue;
            int is_send = xi->kind == SL_XFER_SEND, blocked = 0;
            for (int j = 0; j < i && !blocked; j++)
                blocked = x[j].done != x[j].bytes && x[j].peer == xi->peer &&
                          (x[j].kind == SL_XFER_SEND) == is_send;
            if (blocked) continue;
            if (is_send) {
                chan *c = (chan *)t->to[xi->peer];
                uint64_t tail = atomic_load_explicit(&c->tail, memory_order_relaxed);
                uint64_t head = atomic_load_explicit(&c->head, memory_order_acquire);
                if (t->pull_min && xi->bytes >= t->pull_min) {
                    if (!xi->aux && tail - head < ns) { /* post the descriptor */
                        pull_desc d = {(uint64_t)(uintptr_t)xi->buf, xi->bytes};
                        memcpy(slot_ptr(t, t->to[xi->peer], tail), &d, sizeof d);
                        atomic_store_explicit(&c->tail, ++tail, memory_order_release);
                        xi->aux = tail;
                        progressed = 1;
                    }
                    if (xi->aux && head >= xi->aux) { /* consumed: the peer has copied it */
                        xi->done = xi->bytes;
                        progressed = 1;
                    }
                }
                while (!(t->pull_min && xi->bytes >= t->pull_min) && xi->done < xi->bytes &&
                       tail - head < ns) {
                    size_t len = xi->bytes - xi->done;
                    if (len > t->slot_bytes) len = t->slot_bytes;
                    memcpy(slot_ptr(t, t->to[xi->peer], tail), (char *)xi->buf + xi->done, len);
                    xi->done += len;
                    atomic_store_explicit(&c->tail, ++tail, memory_order_release);
                    progressed = 1;
                    if (tail - head >= ns) head = atomic_load_explicit(&c->head, memory_order_acquire);
                }
            } else {
                chan *c = (chan *)t->from[xi->peer];
                uint64_t head = atomic_load_explicit(&c->head, memory_order_relaxed);
                uint64_t tail = atomic_load_explicit(&c->tail, memory_order_acquire);
                if (t->pull_min && xi->bytes >= t->pull_min) {
                    if (head < tail) {
                        SL_TRY(pull_recv(t, xi, slot_ptr(t, t->from[xi->peer], head)));
                        /* a sender that aborted may have reused its buffer while we read it; it
                         * raises its aborted flag before returning, so this check catches it */
                        if (atomic_load(&t->peer[xi->peer]->aborted[0]))
                            return sl_fail(SL_ERR_PEER, "rank %d aborted its communicator", xi->peer);
                        xi->done = xi->bytes;
                        atomic_store_explicit(&c->head, ++head, memory_order_release);
                        progressed = 1;
                    }
                }
                while (!(t->pull_min && xi->bytes >= t->pull_min) && xi->done < xi->bytes && head < tail) {
                    size_t len = xi->bytes - xi->done;
                    if (len > t->slot_bytes) len = t->slot_bytes;
                    slot_consume(t, xi, (char *)xi->buf + xi->done,
                                 xi->kind == SL_XFER_RECV ? NULL : (const char *)xi->src + xi->done,
                                 slot_ptr(t, t->from[xi->peer], head), len);
                    xi->done += len;
                    atomic_store_explicit(&c->head, ++head, memory_order_release);
                    progressed = 1;
                    if (head >= tail) tail = atomic_load_explicit(&c->tail, memory_order_acquire);
                }
            }
            if (xi->done == xi->bytes) remaining--;
        }
        if (progressed) {
            iter = 0;
            dead = SL_OK;
            continue;
        }
        if (dead != SL_OK) return dead; /* a full pass after the death found nothing left */
        if (atomic_load_explicit(t->base.abort_flag, memory_order_relaxed))
            return sl_fail(SL_ERR_ABORTED, "communicator aborted");
        sl_comm_backoff(&iter, t->spin);
        if ((iter < t->spin && (iter & 255)) || (iter < YIELD_ITERS && (iter & 15))) continue;
        double now = sl_time_sec();
        if (now > deadline) {
            int who = -1;
            for (int i = 0; i < n && who < 0; i++)
                if (x[i].done != x[i].bytes) who = x[i].peer;
            return sl_fail(SL_ERR_TIMEOUT,
                           "%s transport: no progress with rank %d before the deadline "
                           "(SUANLI_COMM_TIMEOUT)",
                           t->base.vt->name, who);
        }
        if (now >= t->next_check) {
            t->next_check = now + 0.01;
            /* a peer that exited after its last write is not an error yet: drain first */
            for (int i = 0; i < n && dead == SL_OK; i++)
                if (x[i].done != x[i].bytes) dead = peer_check(t, x[i].peer);
        }
    }
    return SL_OK;
}

static void fifo_abort(sl_transport *t_) {
    fifo_tp *t = (fifo_tp *)t_;
    if (t->loopback)
        atomic_store(&t->block->aborted[t->base.rank], 1);
    else if (t->maps && t->maps[t->base.rank])
        atomic_store(&((seg_hdr *)t->maps[t->base.rank])->aborted[0], 1);
}

static void fifo_destroy(sl_transport *t_) {
    fifo_tp *t = (fifo_tp *)t_;
    if (!t) return;
    if (t->loopback) {
        /* last one out frees the shared block; the refcount lives in magic's slot */
        if (t->block && __atomic_fetch_sub(&t->block->magic, 1, __ATOMIC_ACQ_REL) == 1)
            sl_free_aligned(t->block);
    } else if (t->maps) {
        for (int r = 0; r < t->base.size; r++)
            if (t->maps[r]) munmap(t->maps[r], t->map_bytes);
    }
    sl_free_aligned(t->pull_tmp);
    sl_free_aligned(t->nt_tmp);
    free(t->to);
    free(t->from);
    free(t->peer);
    free(t->maps);
    free(t);
}

/* ---- symmetric windows (Note [Symmetric windows] in comm_internal.h) ---- */
typedef struct win_hello {
    uint64_t ok, bytes, ptr; /* ptr: loopback rank 0's block */
} win_hello;

/* all[p] = rank p's `mine` over the FIFOs; collective over the transport's ranks */
static sl_status fifo_allgather(fifo_tp *t, const void *mine, void *all, size_t bytes, double deadline) {
    int n = t->base.size, r = t->base.rank, k = 0;
    sl_xfer *x = calloc(2 * (size_t)n, sizeof *x);
    if (!x) return sl_fail(SL_ERR_NOMEM, "window: out of memory");
    memcpy((char *)all + (size_t)r * bytes, mine, bytes);
    for (int p = 0; p < n; p++) {
        if (p == r) continue;
        x[k++] = (sl_xfer){.kind = SL_XFER_SEND, .peer = p, .buf = (void *)mine, .bytes = bytes};
        x[k++] = (sl_xfer){
            .kind = SL_XFER_RECV, .peer = p, .buf = (char *)all + (size_t)p * bytes, .bytes = bytes};
    }
    sl_status st = fifo_exchange(&t->base, x, k, deadline);
    free(x);
    return st;
}

/* every rank succeeded, and with the same size (the same verdict on every rank) */
static sl_status win_check(const win_hello *all, int n, const char *what) {
    for (int p = 0; p < n; p++) {
        if (!all[p].ok)
            return sl_fail(SL_ERR_IO, "sl_comm_mem_alloc: rank %d could not %s its window", p, what);
        if (all[p].bytes != all[0].bytes)
            return sl_fail(SL_ERR_INVALID,
                           "sl_comm_mem_alloc: rank %d asked for %llu bytes, rank 0 for %llu (windows are "
                           "symmetric: every rank must pass the same size)",
                           p, (unsigned long long)all[p].bytes, (unsigned long long)all[0].bytes);
    }
    return SL_OK;
}

static size_t win_map_bytes(size_t b) { return ((b ? b : 1) + 4095) & ~(size_t)4095; }

static sl_status shm_win_alloc(sl_transport *t_, sl_win *w, double deadline) {
    fifo_tp *t = (fifo_tp *)t_;
    int n = t->base.size, r = t->base.rank;
    size_t mb = win_map_bytes(w->bytes);
    win_hello mine = {0, w->bytes, 0}, *all = calloc((size_t)n, sizeof *all);
    char **peer = calloc((size_t)n, sizeof *peer), name[256];
    if (!all || !peer) {
        free(all);
        free(peer);
        return sl_fail(SL_ERR_NOMEM, "sl_comm_mem_alloc: out of memory");
    }
    snprintf(name, sizeof name, "/%s-w%llu-r%d", t->name, (unsigned long long)w->id, r);
    shm_unlink(name); /* stale from a crashed run with the same name */
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600), err = fd < 0 ? errno : 0;
    if (fd >= 0) {
        /* reserve the pages now: a /dev/shm too small (containers) is an error here, not a SIGBUS later */
        err = posix_fallocate(fd, 0, (off_t)mb);
        if (!err) {
            void *m = mmap(NULL, mb, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (m != MAP_FAILED)
                peer[r] = m, mine.ok = 1;
            else
                err = errno;
        }
        close(fd);
        if (!mine.ok) shm_unlink(name);
    }
    if (!mine.ok) SL_LOGW("sl_comm_mem_alloc: cannot create %s (%zu bytes): %s", name, mb, strerror(err));
    sl_status st = fifo_allgather(t, &mine, all, sizeof mine, deadline), st2 = st;
    if (st == SL_OK) st = win_check(all, n, "create");
    for (int p = 0; p < n && st == SL_OK; p++) {
        if (p == r) continue;
        char pname[256];
        snprintf(pname, sizeof pname, "/%s-w%llu-r%d", t->name, (unsigned long long)w->id, p);
        int pfd = shm_open(pname, O_RDWR, 0600);
        if (pfd < 0) {
            st = sl_fail(SL_ERR_IO, "sl_comm_mem_alloc: cannot open %s: %s", pname, strerror(errno));
            break;
        }
        void *m = mmap(NULL, mb, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
        close(pfd);
        if (m == MAP_FAILED) {
            st = sl_fail(SL_ERR_IO, "sl_comm_mem_alloc: cannot map %s: %s", pname, strerror(errno));
            break;
        }
        peer[p] = m;
    }
    if (st2 == SL_OK && all[0].ok) { /* second round only if the first reached everyone */
        int created = 1;
        for (int p = 0; p < n; p++) created &= all[p].ok && all[p].bytes == all[0].bytes;
        if (created) {
            win_hello mapped = {st == SL_OK, w->bytes, 0};
            st2 = fifo_allgather(t, &mapped, all, sizeof mapped, deadline);
            if (st == SL_OK) st = st2 != SL_OK ? st2 : win_check(all, n, "map");
        }
    }
    if (mine.ok) shm_unlink(name); /* everyone mapped it (or gave up): nothing stays in /dev/shm */
    free(all);
    if (st != SL_OK) {
        for (int p = 0; p < n; p++)
            if (peer[p]) munmap(peer[p], mb);
        free(peer);
        return st;
    }
    w->base = peer[r];
    w->peer = peer;
    w->shared = 1;
    return SL_OK;
}

static void shm_win_release(sl_transport *t_, sl_win *w) {
    size_t mb = win_map_bytes(w->bytes);
    for (int p = 0; p < t_->size; p++)
        if (w->peer[p]) munmap(w->peer[p], mb);
    free(w->peer);
    w->peer = NULL;
}

/* loopback: rank 0 allocates one block of n regions; the last rank to release it frees it */
typedef struct lb_win_block {
    atomic_int refs;
} lb_win_block;
#define LB_WIN_HDR 4096

static sl_status lb_win_alloc(sl_transport *t_, sl_win *w, double deadline) {
    fifo_tp *t = (fifo_tp *)t_;
    int n = t->base.size, r = t->base.rank;
    size_t stride = win_map_bytes(w->bytes);
    win_hello mine = {1, w->bytes, 0}, *all = calloc((size_t)n, sizeof *all);
    char **peer = calloc((size_t)n, sizeof *peer);
    if (!all || !peer) {
        free(all);
        free(peer);
        return sl_fail(SL_ERR_NOMEM, "sl_comm_mem_alloc: out of memory");
    }
    lb_win_block *blk = NULL;
    if (r == 0) {
        blk = sl_malloc_aligned(LB_WIN_HDR + (size_t)n * stride);
        if (blk) atomic_store(&blk->refs, n);
        mine.ok = blk != NULL;
        mine.ptr = (uint64_t)(uintptr_t)blk;
    }
    sl_status st = fifo_allgather(t, &mine, all, sizeof mine, deadline);
    if (st == SL_OK) st = win_check(all, n, "allocate");
    if (st != SL_OK) {
        if (r == 0) sl_free_aligned(blk); /* every rank failed with it: nobody else holds it */
        free(all);
        free(peer);
        return st;
    }
    blk = (lb_win_block *)(uintptr_t)all[0].ptr;
    for (int p = 0; p < n; p++) peer[p] = (char *)blk + LB_WIN_HDR + (size_t)p * stride;
    free(all);
    w->base = peer[r];
    w->peer = peer;
    w->priv = blk;
    w->shared = 1;
    return SL_OK;
}

static void lb_win_release(sl_transport *t_, sl_win *w) {
    (void)t_;
    lb_win_block *blk = w->priv;
    if (blk && atomic_fetch_sub(&blk->refs, 1) == 1) sl_free_aligned(blk);
    free(w->peer);
    w->peer = NULL;
}

static _Atomic uint64_t *fifo_win_ctl(sl_transport *t_, int r) {
    fifo_tp *t = (fifo_tp *)t_;
    if (t->loopback)
        return (_Atomic uint64_t *)((char *)t->block + t->block->ctl_off + (size_t)r * SL_WIN_CTL * 8);
    return (_Atomic uint64_t *)((char *)t->maps[r] + SEG_CTL);
}

/* Same waiting rules as fifo_exchange (Note [Waiting]): spin, yield, sleep; abort flag, deadline and
 * the peer's liveness (every 10 ms) checked while waiting. */
static sl_status fifo_win_wait(sl_transport *t_, int peer, int word, uint64_t v, double deadline) {
    fifo_tp *t = (fifo_tp *)t_;
    _Atomic uint64_t *w = fifo_win_ctl(t_, peer) + word;
    unsigned iter = 0;
    for (;;) {
        if (atomic_load_explicit(w, memory_order_acquire) >= v) return SL_OK;
        if (atomic_load_explicit(t->base.abort_flag, memory_order_relaxed))
            return sl_fail(SL_ERR_ABORTED, "communicator aborted");
        sl_comm_backoff(&iter, t->spin);
        if ((iter < t->spin && (iter & 255)) || (iter < YIELD_ITERS && (iter & 15))) continue;
        double now = sl_time_sec();
        if (now > deadline)
            return sl_fail(SL_ERR_TIMEOUT,
                           "%s transport: window operation: no progress with rank %d before the deadline "
                           "(SUANLI_COMM_TIMEOUT; or it issued a different operation)",
                           t->base.vt->name, peer);
        if (now >= t->next_check) {
            t->next_check = now + 0.01;
            SL_TRY(peer_check(t, peer));
        }
    }
}

static const sl_win_vt shm_win_vt = {shm_win_alloc, shm_win_release, fifo_win_ctl, fifo_win_wait};
static const sl_win_vt lb_win_vt = {lb_win_alloc, lb_win_release, fifo_win_ctl, fifo_win_wait};
static const sl_transport_vt shm_vt = {"shm", fifo_exchange, fifo_abort, fifo_destroy};
static const sl_transport_vt lb_vt = {"loopback", fifo_exchange, fifo_abort, fifo_destroy};

static fifo_tp *fifo_alloc(int rank, int size, int loopback) {
    fifo_tp *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->base.vt = loopback ? &lb_vt : &shm_vt;
    t->base.kind = loopback ? SL_COMM_TRANSPORT_LOOPBACK : SL_COMM_TRANSPORT_SHM;
    t->base.rank = rank;
    t->base.size = size;
    t->base.alpha = 1e-6;
    t->base.beta = 1.0 / 8e9;
    t->base.win = loopback ? &lb_win_vt : &shm_win_vt;
    t->loopback = loopback;
    t->spin = (unsigned)env_size("SUANLI_COMM_SPIN", sl_comm_spin_budget(size), 0, YIELD_ITERS);
    /* loopback never pulls: a thread that aborts may free the buffer a peer is reading */
    /* pulls only when ranks outnumber CPUs (a descheduled sender does not stall the copy): with a
     * core each, two ranks streaming through cache-resident slots measured as fast or faster at
     * every size (docs/BENCHMARKS-comm.md) without the page pinning of process_vm_readv */
    size_t pull_dflt = size > sysconf(_SC_NPROCESSORS_ONLN) ? 256 : 0;
    t->pull_min = loopback ? 0 : env_size("SUANLI_SHM_PULL_KB", pull_dflt, 0, (size_t)1 << 30) * 1024;
    t->nt_min = env_size("SUANLI_SHM_NT_KB", 4096, 0, (size_t)1 << 30) * 1024;
    t->move_min = loopback ? 0 : env_size("SUANLI_SHM_MOVE_PULL_KB", 64, 0, (size_t)1 << 30) * 1024;
    t->nt_tmp = sl_malloc_aligned(NT_BLOCK);
    /* 4 slots of 1 MiB per ring (fewer hand-offs when ranks share cores); smaller with many ranks
     * so that one rank's segment stays near 64 MiB */
    size_t dflt_kb = size <= 4 ? 1024 : size <= 8 ? 512 : size <= 16 ? 256 : 64;
    t->slot_bytes = env_size("SUANLI_SHM_SLOT_KB", dflt_kb, 4, 16384) * 1024;
    t->nslots = (int)env_size("SUANLI_SHM_SLOTS", 4, 2, 1024);
    t->to = calloc((size_t)size, sizeof(char *));
    t->from = calloc((size_t)size, sizeof(char *));
    t->peer = calloc((size_t)size, sizeof(seg_hdr *));
    if (!t->to || !t->from || !t->peer || !t->nt_tmp) {
        fifo_destroy(&t->base);
        return NULL;
    }
    return t;
}

/* ---- loopback: one block with n*n rings; ring (s -> d) at index d*n + s ---- */
static seg_hdr *lb_block_new(int n, int nslots, size_t slot_bytes) {
    size_t cb = ((CHAN_HDR + (size_t)nslots * slot_bytes) + 63) & ~(size_t)63;
    size_t ctl_off = SEG_HDR + (size_t)n * (size_t)n * cb, ctl_bytes = (size_t)n * SL_WIN_CTL * 8;
    seg_hdr *b = sl_malloc_aligned(ctl_off + ctl_bytes);
    if (!b) return NULL;
    memset(b, 0, SEG_HDR);
    memset((char *)b + ctl_off, 0, ctl_bytes);
    b->ctl_off = ctl_off;
    for (int i = 0; i < n * n; i++) memset((char *)b + SEG_HDR + (size_t)i * cb, 0, CHAN_HDR);
    b->magic = (uint64_t)n; /* refcount */
    b->n = n;
    b->nslots = nslots;
    b->slot_bytes = slot_bytes;
    b->chan_bytes = cb;
    return b;
}
static void lb_wire(fifo_tp *t, seg_hdr *b) {
    int n = t->base.size, r = t->base.rank;
    t->block = b;
    t->nslots = b->nslots;
    t->slot_bytes = b->slot_bytes;
    for (int p = 0; p < n; p++) {
        t->to[p] = (char *)b + SEG_HDR + (size_t)(p * n + r) * b->chan_bytes;
        t->from[p] = (char *)b + SEG_HDR + (size_t)(r * n + p) * b->chan_bytes;
    }
}

sl_status sl_tp_loopback_new_all(int n, sl_transport **out) {
    if (n > 64) return sl_fail(SL_ERR_INVALID, "loopback transport: at most 64 ranks (got %d)", n);
    fifo_tp *t0 = fifo_alloc(0, n, 1);
    if (!t0) return sl_fail(SL_ERR_NOMEM, "loopback transport: out of memory");
    seg_hdr *b = lb_block_new(n, t0->nslots, t0->slot_bytes);
    fifo_destroy(&t0->base);
    if (!b) return sl_fail(SL_ERR_NOMEM, "loopback transport: out of memory");
    for (int r = 0; r < n; r++) {
        fifo_tp *t = fifo_alloc(r, n, 1);
        SL_ASSERT(t);
        lb_wire(t, b);
        out[r] = &t->base;
    }
    return SL_OK;
}

sl_status sl_tp_loopback_new(sl_oob *oob, sl_transport **out) {
    int n = oob->size, r = oob->rank;
    if (n > 64) return sl_fail(SL_ERR_INVALID, "loopback transport: at most 64 ranks (got %d)", n);
    fifo_tp *t = fifo_alloc(r, n, 1);
    if (!t) return sl_fail(SL_ERR_NOMEM, "loopback transport: out of memory");
    seg_hdr *mine = r == 0 ? lb_block_new(n, t->nslots, t->slot_bytes) : NULL;
    seg_hdr **all = calloc((size_t)n, sizeof *all);
    sl_status st = all ? oob->allgather(oob, &mine, all, sizeof mine) : SL_ERR_NOMEM;
    if (st == SL_OK && !all[0]) st = sl_fail(SL_ERR_NOMEM, "loopback transport: out of memory");
    if (st == SL_OK) lb_wire(t, all[0]);
    free(all);
    if (st != SL_OK) {
        fifo_destroy(&t->base);
        return st;
    }
    *out = &t->base;
    return SL_OK;
}

/* ---- shm: each rank owns one POSIX shm segment holding the rings it receives on ---- */
sl_status sl_tp_shm_new(sl_oob *oob, sl_transport **out) {
    int n = oob->size, r = oob->rank;
    sl_status st = SL_OK;
    fifo_tp *t = fifo_alloc(r, n, 0);
    int *ok = calloc((size_t)n, sizeof(int));
    char name[256];
    if (!t || !ok || !(t->maps = calloc((size_t)n, sizeof(void *)))) {
        st = sl_fail(SL_ERR_NOMEM, "shm transport: out of memory");
        goto done;
    }
    size_t cb = ((CHAN_HDR + (size_t)t->nslots * t->slot_bytes) + 4095) & ~(size_t)4095;
    t->map_bytes = SEG_HDR + (size_t)n * cb;
    snprintf(t->name, sizeof t->name, "%s", oob->name);
    snprintf(name, sizeof name, "/%s-r%d", oob->name, r);
    shm_unlink(name); /* stale from a crashed run with the same name */
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    int mine_ok = 0;
    if (fd >= 0) {
        /* reserve the pages now (as the windows do): a /dev/shm that fills up later (a peer's window, a
         * container's small tmpfs) must be an error here, not a SIGBUS when a slot is first written */
        int ferr = posix_fallocate(fd, 0, (off_t)t->map_bytes);
        if (ferr) errno = ferr;
        if (!ferr) {
            void *m = mmap(NULL, t->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (m != MAP_FAILED) {
                t->maps[r] = m;
                seg_hdr *h = m;
                h->pid = (int)getpid();
                h->nslots = t->nslots;
                h->slot_bytes = t->slot_bytes;
                h->chan_bytes = cb;
                h->n = n;
                atomic_store(&h->aborted[0], 0);
                h->probe = SEG_MAGIC;
                h->probe_addr = (uint64_t)(uintptr_t)&h->probe;
                h->magic = SEG_MAGIC;
                mine_ok = 1;
            }
        }
        close(fd);
    }
    if (!mine_ok) {
        SL_LOGE("shm transport: cannot create %s (%zu bytes): %s", name, t->map_bytes, strerror(errno));
        if (fd >= 0) shm_unlink(name);
    }
    st = oob->allgather(oob, &mine_ok, ok, sizeof(int));
    if (st != SL_OK) { /* our name must not outlive us in /dev/shm; done: frees t and the mapping */
        if (mine_ok) shm_unlink(name);
        goto done;
    }
    for (int p = 0; p < n; p++)
        if (!ok[p]) {
            st =
                sl_fail(SL_ERR_IO, "shm transport: rank %d could not create its segment (/dev/shm full?)", p);
            goto done;
        }
    for (int p = 0; p < n; p++) {
        if (p == r) continue;
        snprintf(name, sizeof name, "/%s-r%d", oob->name, p);
        int pfd = shm_open(name, O_RDWR, 0600);
        if (pfd < 0) {
            st = sl_fail(SL_ERR_IO, "shm transport: cannot open %s: %s", name, strerror(errno));
            break;
        }
        void *m = mmap(NULL, t->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
        close(pfd);
        if (m == MAP_FAILED) {
            st = sl_fail(SL_ERR_IO, "shm transport: cannot map %s: %s", name, strerror(errno));
            break;
        }
        t->maps[p] = m;
        if (((seg_hdr *)m)->magic != SEG_MAGIC || ((seg_hdr *)m)->chan_bytes != cb) {
            st = sl_fail(SL_ERR_INVALID,
                         "shm transport: rank %d uses another slot configuration "
                         "(SUANLI_SHM_SLOT_KB/SUANLI_SHM_SLOTS must match)",
                         p);
            break;
        }
    }
    mine_ok = st == SL_OK ? 1 : 0;
    if (st == SL_OK && (t->pull_min || t->move_min)) { /* can we read every peer's memory (CMA)? bit 1 */
        int cma = 1;
        for (int p = 0; p < n && cma; p++) {
            if (p == r) continue;
            seg_hdr *h = t->maps[p];
            uint64_t v = 0;
            struct iovec l = {&v, sizeof v}, rv = {(void *)(uintptr_t)h->probe_addr, sizeof v};
            cma = process_vm_readv(h->pid, &l, 1, &rv, 1, 0) == (ssize_t)sizeof v && v == SEG_MAGIC;
        }
        mine_ok |= cma << 1;
    }
    sl_status st2 = oob->allgather(oob, &mine_ok, ok, sizeof(int)); /* everyone mapped: unlink */
    snprintf(name, sizeof name, "/%s-r%d", oob->name, r);
    shm_unlink(name);
    if (st != SL_OK) goto done;
    SL_CHECK(st2);
    int all_cma = 1;
    for (int p = 0; p < n; p++) {
        if (!(ok[p] & 1)) {
            st = sl_fail(SL_ERR_IO, "shm transport: rank %d could not map its peers", p);
            goto done;
        }
        all_cma &= (ok[p] >> 1) & 1;
    }
    if (!all_cma) t->pull_min = t->move_min = 0;
    if (t->pull_min || t->move_min)
        t->base.peer_read = fifo_peer_read, t->base.peer_read_min = t->move_min ? t->move_min : t->pull_min;
    if (t->pull_min && !(t->pull_tmp = sl_malloc_aligned(PULL_CHUNK))) {
        st = sl_fail(SL_ERR_NOMEM, "shm transport: out of memory");
        goto done;
    }
    for (int p = 0; p < n; p++) {
        t->peer[p] = t->maps[p];
        t->to[p] = (char *)t->maps[p] + SEG_HDR + (size_t)r * cb;
        t->from[p] = (char *)t->maps[r] + SEG_HDR + (size_t)p * cb;
    }
done:
    free(ok);
    if (st != SL_OK) {
        if (t) fifo_destroy(&t->base);
        return st;
    }
    *out = &t->base;
    return SL_OK;
}
