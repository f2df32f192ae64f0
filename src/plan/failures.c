/* Checkpoint intervals (Young 1974, Daly 2006) and a discrete-event simulation of a long run with failures.
 *
 * Note [Failure simulation]
 * The job needs `hosts` hosts; each fails independently at rate 1 / host_mtbf while the job runs, so the
 * job sees a Poisson process of rate hosts / host_mtbf (a replaced host is as good as new, so the process
 * stays memoryless). The run alternates segments: interval_sec of work, then a save of save_sec; a
 * segment counts only once its save completed (a failure during the save loses the segment). After a
 * failure the lost time is everything since the last commit; the failed host goes to repair (back in the
 * pool after repair_sec), a hot spare takes its place at once when one is free, otherwise the job waits for
 * the first repaired host; then it restores for restore_sec, and a failure during the restore starts it
 * again. Failure times come from the counter-based Philox stream (sl_rng_uniform(seed, 17, k) for the k-th
 * draw; one per failure: the time to the next one covers whole segments), so a run is a pure function of
 * its options. With unlimited spares this is exactly Daly's model, whose expected time per segment is M
 * e^{R/M} (e^{(tau+delta)/M} - 1) (sl_plan_expected_goodput); the test checks the simulation against it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "suanli/plan.h"

double sl_plan_young_interval(double save_sec, double mtbf_sec) { return sqrt(2.0 * save_sec * mtbf_sec); }

double sl_plan_daly_interval(double d, double M) {
    if (d >= 2.0 * M) return M;
    double x = d / (2.0 * M);
    return sqrt(2.0 * d * M) * (1.0 + sqrt(x) / 3.0 + x / 9.0) - d;
}

double sl_plan_expected_goodput(const sl_plan_ckpt *c, double tau) {
    double M = c->mtbf_sec;
    if (tau <= 0 || M <= 0) return 0;
    return tau / (M * exp(c->restore_sec / M) * expm1((tau + c->save_sec) / M));
}

typedef struct {
    const sl_plan_sim_opts *o;
    double t, rate;
    uint64_t draws;
    double *back; /* times at which repaired hosts return to the pool */
    int64_t nback, cap;
    int64_t spares;
    sl_plan_sim_result *r;
} sim;

static double next_gap(sim *s) {
    double u = sl_rng_uniform(s->o->seed, 17, s->draws++);
    return -log1p(-u) / s->rate;
}

/* the failed host goes to repair; a spare (or the first repaired host, after a wait) replaces it */
static sl_status replace_host(sim *s) {
    for (int64_t i = 0; i < s->nback;) { /* repaired hosts rejoin the pool */
        if (s->back[i] <= s->t) {
            s->spares++;
            s->back[i] = s->back[--s->nback];
        } else {
            i++;
        }
    }
    if (s->nback == s->cap) {
        int64_t cap = s->cap ? 2 * s->cap : 64;
        double *nb = realloc(s->back, sizeof(double) * (size_t)cap);
        if (!nb) return sl_fail(SL_ERR_NOMEM, "simulate: out of memory");
        s->back = nb;
        s->cap = cap;
    }
    s->back[s->nback++] = s->t + s->o->repair_sec;
    if (s->spares > 0) {
        s->spares--;
        return SL_OK;
    }
    int64_t first = 0;
    for (int64_t i = 1; i < s->nback; i++)
        if (s->back[i] < s->back[first]) first = i;
    s->r->wait_sec += s->back[first] - s->t;
    s->r->waits_for_spare++;
    s->t = s->back[first];
    s->back[first] = s->back[--s->nback];
    return SL_OK;
}

/* failures drawn (in a segment or cutting a restore short) before a run counts as never finishing: its
 * goodput would be a fraction of a percent (accel-10k at --mtbf-hours 20: 8.3 million failures, 0.01 %) */
enum { SIM_MAX_DRAWS = 2000000 };

static sl_status never_finishes(void) {
    return sl_fail(SL_ERR_INVALID,
                   "--simulate-failures: the run never finishes (over %d failures: host MTBF "
                   "far below the interval or the restore time)",
                   SIM_MAX_DRAWS);
}

/* a failure at s->t (already advanced): repair/replace, then restore until one succeeds */
static sl_status recover(sim *s) {
    for (;;) {
        if (s->draws > SIM_MAX_DRAWS) return never_finishes();
        s->r->failures++;
        SL_TRY(replace_host(s));
        double f = next_gap(s);
        if (f >= s->o->restore_sec) {
            s->t += s->o->restore_sec;
            return SL_OK;
        }
        s->t += f;
    }
}

sl_status sl_plan_simulate(const sl_plan_sim_opts *o, sl_plan_sim_result *r) {
    memset(r, 0, sizeof *r);
    if (!(o->work_sec > 0) || !(o->interval_sec > 0) || o->hosts < 1 || !(o->host_mtbf_sec > 0) ||
        o->save_sec < 0 || o->restore_sec < 0 || o->spares < 0 || o->repair_sec < 0)
        return sl_fail(SL_ERR_INVALID,
                       "--simulate-failures: work, interval, hosts and MTBF must be > 0, times >= 0");
    sim s = {.o = o, .rate = (double)o->hosts / o->host_mtbf_sec, .spares = o->spares, .r = r};
    /* segments 0 .. nseg-1: interval + save each, the last the rest of the work and no save. One draw per
     * failure: the time to the next failure covers whole segments (memoryless, the rest goes on); a draw
     * per segment made runs with a 1 s interval draw millions (accel-10k at --mtbf-hours 50: 62 s) */
    int64_t nseg = (int64_t)ceil(o->work_sec / o->interval_sec), idx = 0;
    double full = o->interval_sec + o->save_sec, last = o->work_sec - (double)(nseg - 1) * o->interval_sec;
    sl_status st = SL_OK;
    while (idx < nseg && st == SL_OK) {
        double f = next_gap(&s);
        int64_t k = idx < nseg - 1 ? (int64_t)fmin(floor(f / full), (double)(nseg - 1 - idx)) : 0;
        s.t += (double)k * full;
        f -= (double)k * full;
        idx += k;
        r->checkpoints += k;
        double need = idx < nseg - 1 ? full : last;
        if (f >= need) {
            s.t += need;
            idx++;
            r->checkpoints++;
        } else {
            s.t += f;
            st = recover(&s);
        }
        if (st == SL_OK && s.draws > SIM_MAX_DRAWS) st = never_finishes();
    }
    free(s.back);
    r->wall_sec = s.t;
    r->goodput = s.t > 0 ? o->work_sec / s.t : 0;
    r->lost_host_hours = (s.t - o->work_sec) * (double)o->hosts / 3600.0;
    return st;
}
