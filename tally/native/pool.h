/* The kernels' own threads: a parallel loop whose caller never waits for a thread that took no work.
 *
 * Not OpenMP's parallel for: every region ends in a barrier that all threads must reach. With waiting threads passive
 * (tally/__init__.py: spinning ones collapse a step beside a busy process) each region of a decode step wakes a
 * sleeping thread, which on a virtual machine goes through the hypervisor; with spinning threads the barrier waits for
 * a thread the kernel has descheduled (docs/benchmarks.md#kernels).
 *
 * Here a job is cut into one contiguous share a thread (a decode step's projections stream best so: each thread one
 * run of weights), and each share into PIECES pieces, claimed through one atomic word a share (generation << 32 |
 * front << 16 | back): a thread takes its own share's pieces from the front, then the other shares' last pieces from
 * their backs, so whoever finishes first takes the end of a slower share, and the caller waits only for pieces
 * someone is running. Helpers spin SPIN_NS after their last piece (a step's next projection comes within
 * microseconds), then sleep on a condition variable; a job finds them awake, or wakes them (once until one of them
 * runs) and starts without them. A helper descheduled while it holds a piece still stalls the caller, which then
 * measures it: a wait longer than a hiccup (LATE_NS) and than two of its own pieces sends the caller alone for
 * ALONE_NS, 4 times as long after each late one (up to ALONE_MAX_NS), and half as long again only after TRUST_NS of
 * threaded jobs on time (times, not job counts: a prompt's jobs take far longer than a decode step's). After a run
 * alone the sleeping helpers are woken and the next jobs run alone until one of them has run; the first threaded job
 * then (the probe) counts as late if none of them joins it. Beside one busy process a decode step then runs mostly
 * alone.
 * Threads: omp_get_max_threads() of the calling thread, which torch.set_num_threads sets. A second caller while a job
 * runs (another Python thread) runs its loop alone. */
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

typedef void (*RangeFn)(const void *ctx, int64_t begin, int64_t end);

#define POOL_MAX 255           /* helper threads at most */
#define SPIN_NS 100000         /* a helper's spin after its last piece, before it sleeps */
#define PIECES 8               /* a share's pieces (chosen by measurement: docs/benchmarks.md#kernels) */
#define ALONE_NS 1000000       /* the first run alone after a late helper (less than a small model's decode step) */
#define ALONE_MAX_NS 200000000
#define LATE_NS 500000         /* a shorter wait is a hiccup, not a core lost to a neighbour for a scheduler slice
                                * (milliseconds) */
#define TRUST_NS 50000000      /* threaded time on time that halves the next run alone */
#define PROBE_WAIT 64          /* jobs alone after such a run while the helpers woken for the probe have not run */
#define PROBE_SPIN_NS 1000000  /* a helper woken for a probe spins this long: jobs alone may take longer than SPIN_NS */

static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    _Atomic uint32_t gen;       /* the current job's generation */
    _Atomic int64_t done;       /* pieces of the current job finished */
    _Atomic int sleepers, busy; /* helpers asleep; a caller holds the pool */
    _Atomic int wake_sent;      /* a wake-up is on its way to the sleepers: no second one until one of them runs */
    _Atomic uint32_t wakes;     /* wake-ups without a job, for a probe */
    _Atomic uint32_t answered;  /* the last of them a helper has run after */
    _Atomic int64_t helper_pieces; /* pieces helpers have run, ever: a test's proof that work was split */
    int helpers;                /* started */
    _Atomic int active;         /* helpers the current job may use: the caller's thread count - 1 */
    _Atomic int64_t spin_ns;    /* how long helpers spin after the current job: 0 before a torch op */
    int64_t alone_until;        /* the end of a run alone (now_ns), or 0 */
    int64_t alone_next;         /* how long the next late helper or failed probe sends the caller alone */
    int64_t trusted;            /* threaded time on time since the last late helper */
    int probe;                  /* the next threaded job is the first after a run alone */
    int64_t probe_waits;        /* jobs run alone since, waiting for a woken helper to run */
    RangeFn fn;                 /* the current job: read by a helper only after it claimed one of its pieces */
    const void *ctx;
    int shares;                 /* threads the job is cut for */
    struct {                    /* share s: items [first, first + len) in min(len, PIECES) pieces */
        _Alignas(64) _Atomic uint64_t word;  /* generation << 32 | the front piece << 16 | the piece past the back
                                              * one; a line each: one thread's claims do not move another's */
        int64_t first, len;     /* set with the word, read after a claim */
    } share[POOL_MAX + 1];
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER, .alone_next = ALONE_NS};

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Run pieces of job `gen`: share `own` from its front, then the other shares' last pieces from their backs, until
 * none is left; how many. A thread's own pieces follow each other in memory (its stream of weights), and one that
 * finished its share takes the end of a slower one instead of waiting for it. */
static int64_t run_pieces(uint32_t gen, int own) {
    int64_t ran = 0;
    for (int k = 0; k < pool.shares; k++) {
        int s = (own + k) % pool.shares, front = k == 0 && own < pool.shares;
        uint64_t v = atomic_load(&pool.share[s].word);
        while ((uint32_t)(v >> 32) == gen && (v >> 16 & 0xFFFF) < (v & 0xFFFF)) {
            /* own share: the front piece; another's: the back one */
            if (!atomic_compare_exchange_weak(&pool.share[s].word, &v, front ? v + (1 << 16) : v - 1)) continue;
            int64_t c = front ? (int64_t)(v >> 16 & 0xFFFF) : (int64_t)(v & 0xFFFF) - 1;
            int64_t first = pool.share[s].first, len = pool.share[s].len, pieces = len < PIECES ? len : PIECES;
            pool.fn(pool.ctx, first + c * len / pieces, first + (c + 1) * len / pieces);
            atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
            ran++;
            v = atomic_load(&pool.share[s].word);
        }
    }
    return ran;
}

static void *helper_main(void *arg) {
    int index = (int)(intptr_t)arg;
    uint32_t seen = atomic_load(&pool.gen);
    for (;;) {
        int64_t deadline = now_ns() + (index < pool.active ? pool.spin_ns : 0);  /* one left out sleeps at once */
        uint32_t gen;
        for (int i = 0; (gen = atomic_load(&pool.gen)) == seen; i++) {
            _mm_pause();
            if ((i & 63) == 63 && now_ns() > deadline) {
                pthread_mutex_lock(&pool.lock);
                atomic_fetch_add(&pool.sleepers, 1);  /* seq_cst against the caller's store, then its load */
                atomic_store(&pool.wake_sent, 0);  /* cleared on entry and after every wait: never a lost wake-up */
                uint32_t wakes = atomic_load(&pool.wakes);
                while (atomic_load(&pool.gen) == seen && atomic_load(&pool.wakes) == wakes) {
                    pthread_cond_wait(&pool.wake, &pool.lock);
                    atomic_store(&pool.wake_sent, 0);
                }
                atomic_fetch_sub(&pool.sleepers, 1);
                pthread_mutex_unlock(&pool.lock);
                int for_probe = atomic_load(&pool.gen) == seen, used = index < pool.active;
                if (used) atomic_store(&pool.answered, atomic_load(&pool.wakes));
                deadline = now_ns() + (!used ? 0 : for_probe ? PROBE_SPIN_NS : pool.spin_ns);
            }
        }
        seen = gen;
        if (index < pool.active) atomic_fetch_add_explicit(&pool.helper_pieces, run_pieces(gen, index + 1),
                                                           memory_order_relaxed);
    }
    return NULL;
}

static void pool_after_fork(void) {  /* a forked child has none of the parent's helpers */
    pool.helpers = 0;
    atomic_store(&pool.sleepers, 0);
    atomic_store(&pool.busy, 0);
    atomic_store(&pool.wake_sent, 0);
    pool.alone_until = 0, pool.probe = 0;  /* nor their lateness */
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
}

static void start_helpers(int wanted) {
    static int registered;
    if (!registered) registered = !pthread_atfork(NULL, NULL, pool_after_fork);
    while (pool.helpers < wanted) {
        pthread_t t;
        /* fewer helpers when one cannot start: the caller does the rest */
        if (pthread_create(&t, NULL, helper_main, (void *)(intptr_t)pool.helpers)) return;
        pthread_detach(t);
        pool.helpers++;
    }
}

/* Wakes sleeping helpers, once until one of them runs (a wake-up that reaches a helper whose core is taken costs
 * the caller microseconds on a VM, and beside a busy process the next jobs would find it still asleep); whether any
 * slept */
static int wake_sleepers(void) {
    if (atomic_load(&pool.sleepers) == 0) return 0;
    if (!atomic_exchange(&pool.wake_sent, 1)) {
        pthread_mutex_lock(&pool.lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.lock);
    }
    return 1;
}

/* parallel_for_then's threaded part, and what it tells of the helpers */
static void parallel_run(int64_t n, RangeFn fn, const void *ctx, int64_t spin_ns) {
    int threads = omp_get_max_threads();
    start_helpers(threads - 1 < POOL_MAX ? threads - 1 : POOL_MAX);
    pool.active = threads - 1 < pool.helpers ? threads - 1 : pool.helpers;
    pool.fn = fn, pool.ctx = ctx, pool.shares = pool.active + 1 < n ? pool.active + 1 : (int)n;
    atomic_store(&pool.spin_ns, spin_ns);
    atomic_store(&pool.done, 0);
    uint32_t gen = atomic_load(&pool.gen) + 1;
    int64_t pieces = 0;
    for (int s = 0; s < pool.shares; s++) {
        int64_t first = s * n / pool.shares, len = (s + 1) * n / pool.shares - first;
        int64_t count = len < PIECES ? len : PIECES;
        pool.share[s].first = first, pool.share[s].len = len;
        atomic_store(&pool.share[s].word, (uint64_t)gen << 32 | (uint64_t)count);  /* after first and len */
        pieces += count;
    }
    atomic_store(&pool.gen, gen);
    int woken = wake_sleepers();  /* then a late helper was waking up, not descheduled */
    int64_t start = now_ns(), ran = run_pieces(gen, 0), finished = now_ns();
    for (int i = 0; atomic_load_explicit(&pool.done, memory_order_acquire) < pieces; i++)
        if ((i & 1023) == 1023) sched_yield(); else _mm_pause();  /* a descheduled helper gets its core back */
    int64_t waited = now_ns() - finished;
    /* late: a helper lost its core while it held a piece (a wait longer than a hiccup, and than 2 of the caller's
     * own pieces); a probe no helper joined: woken ahead of it, none got its core in time */
    int late = !woken && waited > LATE_NS && waited > 2 * (finished - start) / (ran > 0 ? ran : 1);
    if (late || (pool.probe && ran == pieces)) {
        pool.alone_until = finished + waited + pool.alone_next;
        pool.alone_next = pool.alone_next * 4 < ALONE_MAX_NS ? pool.alone_next * 4 : ALONE_MAX_NS;
        pool.trusted = 0;
    } else if ((pool.trusted += finished + waited - start) >= TRUST_NS && pool.alone_next > ALONE_NS) {
        pool.alone_next /= 2;  /* trust earned back slowly: beside a busy process most probes are on time */
        pool.trusted = 0;
    }
    pool.probe = 0;
    atomic_store(&pool.busy, 0);
}

/* fn over [0, n) in ranges; alone when `work` (multiply-adds or alike) is below PAR_MIN or one thread is asked.
 * Helpers spin `spin_ns` after it: SPIN_NS where more of the kernels' jobs follow, 0 where a torch operation does
 * (its OpenMP threads would share the cores with spinning helpers and run slower). */
static void parallel_for_then(int64_t n, int64_t work, RangeFn fn, const void *ctx, int64_t spin_ns) {
    int threads = omp_get_max_threads();
    int expected = 0;
    if (threads <= 1 || n <= 1 || work < PAR_MIN || !atomic_compare_exchange_strong(&pool.busy, &expected, 1)) {
        fn(ctx, 0, n);
        return;
    }
    /* alone while a run alone lasts, and after it until a helper woken for the probe has run (PROBE_WAIT jobs at
     * most: one woken on an idle core takes tens of microseconds on a VM) */
    if (pool.alone_until && now_ns() >= pool.alone_until) {
        uint32_t wakes = atomic_fetch_add(&pool.wakes, 1) + 1;
        if (!wake_sleepers()) atomic_store(&pool.answered, wakes);
        pool.alone_until = 0, pool.probe = 1, pool.probe_waits = 0;
    } else if (!pool.alone_until && !(pool.probe && atomic_load(&pool.answered) != atomic_load(&pool.wakes) &&
                                      pool.probe_waits++ < PROBE_WAIT)) {
        parallel_run(n, fn, ctx, spin_ns);
        return;
    }
    atomic_store(&pool.busy, 0);
    fn(ctx, 0, n);
}

static void parallel_for(int64_t n, int64_t work, RangeFn fn, const void *ctx) {
    parallel_for_then(n, work, fn, ctx, SPIN_NS);
}

int64_t tally_pool_helper_pieces(void) { return atomic_load(&pool.helper_pieces); }
