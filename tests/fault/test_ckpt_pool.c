/* Pooled node-local checkpoints (issue 18) through the CLI, 4 ranks of a tiny GPT-2, "hosts" = directories
 * L/host-<h>. The launcher's in-memory copy is off (SUANLI_MEM_CKPT_DIR=) so that restarts read the pool.
 * - replicas 2 over 2 hosts: a rank killed and its host's directory deleted mid-run; the restart reassembles
 *   the newest checkpoint from the surviving host -> final weights bitwise equal to an uninterrupted run;
 * - erasure code 2+1 over 4 hosts: the same with a lost host, data blocks rebuilt by Reed–Solomon decoding;
 * - a corrupted replica: detected by checksum, the other copy used, resumed bitwise;
 * - a shard smaller than recorded, a block of another stripe: named, not used;
 * - losing more than the redundancy allows: the newest step falls back to the previous complete one, or the
 *   restart fails with a message naming the missing shard file and hosts;
 * - a manifest that places blocks on hosts not in the job (restart with fewer --hosts): named;
 * - tiers: --ckpt-shared drains every pooled save into --save; --save-keep / --ckpt-local-keep per tier;
 * - suanli ckpt inspect / verify / gather, also under `suanli run` from isolated hosts (each rank seeing only
 *   its own host directory);
 * - a restore that loses a host or passes the communicators' deadline (SUANLI_FAULT_RESTORE_STALL / _EXIT):
 *   exit 1 and restarted; damaged copies in every step: exit 2, not restarted;
 * - bad flags: one line naming the flag, exit 2, nothing written. */
#include <glob.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "suanli/ckpt.h"
#include "testutil.h"

static char out[1 << 17];
static char dir[512];
static const char *cli;

static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...) {
    char args[6000], cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "cd %s && SUANLI_MEM_CKPT_DIR= SUANLI_COMM_TIMEOUT=60 timeout 120 %s", dir,
             args);
    return tu_run(cmd, out, sizeof out);
}

static int same(const char *x, const char *y) {
    char a[700], b[700];
    snprintf(a, sizeof a, "%s/%s/model.safetensors", dir, x);
    snprintf(b, sizeof b, "%s/%s/model.safetensors", dir, y);
    return tu_same_file(a, b);
}

static int exists(const char *rel) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, rel);
    return access(p, F_OK) == 0;
}

/* step dirs (also step-N.tmp) or `latest` left under ROOT/host-<h>/.restore for any host h: a pooled resume
 * removes what it rebuilt there once every rank has loaded it (Note [.restore is removed once loaded]) */
static int restore_left(const char *root) {
    char pat[900];
    int n = 0;
    const char *what[2] = {"step-*", "latest"};
    for (int k = 0; k < 2; k++) {
        glob_t g;
        snprintf(pat, sizeof pat, "%s/%s/host-*/.restore/%s", dir, root, what[k]);
        if (glob(pat, 0, NULL, &g) == 0) n += (int)g.gl_pathc;
        globfree(&g);
    }
    return n;
}

#define TINY                                                                                                 \
    "--data-path data --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 "              \
    "--micro-batch-size 1 --global-batch-size 4 --zero-stage 1 --train-iters 12 --lr-decay-iters 12 "        \
    "--eval-interval 0 --eval-iters 1 --threads 1"

#define TINY3                                                                                                \
    "--data-path data --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 "              \
    "--micro-batch-size 1 --global-batch-size 3 --zero-stage 1 --train-iters 12 --lr-decay-iters 12 "        \
    "--eval-interval 0 --eval-iters 1 --threads 1"

static void isolated_hosts(void) {
    int rc;
    /* ---- hosts that cannot see each other's disks (Note [Pool transfers over comm]): every rank runs in its
     * own mount namespace in which every other host's directory is covered by an empty private tmpfs, so a
     * copy written into a peer's directory, or a read from it, would go nowhere. Replicas and blocks must
     * travel over the comm library, the commit must reach every host, and a restart after a lost host must
     * rebuild the newest step from the survivors' own disks: bitwise the uninterrupted run. ---- */
    rc = run("sh -c 'mkdir -p nsprobe && unshare -m sh -c \"mount -t tmpfs none nsprobe\" && rmdir nsprobe'");
    if (rc != 0) {
        printf("SKIP isolated hosts: no mount namespaces here (unshare -m needs root): %s\n", out);
    } else {
        FILE *f;
        char iso[700];
        snprintf(iso, sizeof iso, "%s/iso.sh", dir);
        f = fopen(iso, "w");
        TU_CHECK(f != NULL, "write iso.sh");
        if (f) {
            fputs("# iso.sh ROOT HOSTS CMD...: run CMD seeing only this rank's own ROOT/host-<h>\n"
                  "root=$1; hosts=$2; shift 2\n"
                  "h=$((RANK * hosts / WORLD_SIZE)); i=0\n"
                  "while [ $i -lt $hosts ]; do\n"
                  "  mkdir -p $root/host-$i\n"
                  "  [ $i = $h ] || mount -t tmpfs none $root/host-$i || exit 3\n"
                  "  i=$((i + 1))\n"
                  "done\n"
                  "exec \"$@\"\n",
                  f);
            fclose(f);
        }
        rc = run("env SUANLI_FAULT_KILL_AT_STEP=10 SUANLI_FAULT_RANK=2 SUANLI_FAULT_LOSE_HOSTS=1 %s run -n 4 "
                 "--hosts 2 --max-restarts 1 -- unshare -m sh iso.sh I 2 %s train " TINY
                 " --save iso --load iso --save-interval 4 --ckpt-local-dir I --ckpt-replicas 2",
                 cli, cli);
        TU_CHECK(rc == 0 && strstr(out, "removing I/host-1") &&
                     strstr(out, "reassembled from I (2 hosts, ") &&
                     strstr(out, "missing; using the copy on host 0"),
                 "isolated hosts, replicas: lost host -> restart from the survivor: rc %d %s", rc, out);
        TU_CHECK(same("base", "iso"), "isolated hosts, replicas 2, host 1 lost: final weights bitwise equal");
        /* seen from outside: every host holds both copies of every shard of the last step */
        rc = run("%s ckpt inspect I", cli);
        int oks = 0;
        for (const char *q = out; (q = strstr(q, "safetensors copy on host ")); q++)
            oks += !strncmp(q + 26, ": ok", 4);
        TU_CHECK(rc == 0 && strstr(out, "step-0000012") && oks == 8 && !strstr(out, "missing"),
                 "isolated hosts: all 8 copies (4 shards x 2 hosts) reached their hosts (%d ok): rc %d %s",
                 oks, rc, out);
        /* the offline tools from the isolated hosts themselves (one rank per host, each seeing only its own
         * disk; the other hosts' files over the comm library): the same report, the same verdict, and a
         * gather byte-identical to the one read from outside; with host 1's disk gone, its copies come from
         * host 0; with a shard lost on both, the previous step (written by rank 0 alone) */
        rc = run("%s run -n 2 -- unshare -m sh iso.sh I 2 %s ckpt inspect I", cli, cli);
        oks = 0;
        for (const char *q = out; (q = strstr(q, "safetensors copy on host ")); q++)
            oks += !strncmp(q + 26, ": ok", 4);
        TU_CHECK(rc == 0 && oks == 8 && strstr(out, "every shard file of step-0000012 can be rebuilt") &&
                     !strstr(out, "[1] "),
                 "isolated hosts: ckpt inspect over comm, 8 copies ok, printed by rank 0 only: rc %d %s", rc,
                 out);
        rc = run("%s run -n 2 -- unshare -m sh iso.sh I 2 %s ckpt verify I", cli, cli);
        TU_CHECK(rc == 0 && strstr(out, "step-0000012 can be rebuilt"),
                 "isolated hosts: ckpt verify: rc %d %s", rc, out);
        rc = run(
            "sh -c '%s run -n 2 -- unshare -m sh iso.sh I 2 %s ckpt gather I GI && %s ckpt gather I GO && "
            "diff -r GI GO && %s ckpt verify GI'",
            cli, cli, cli, cli);
        TU_CHECK(rc == 0 && strstr(out, "came over the network") && strstr(out, "all checksums match"),
                 "isolated hosts: ckpt gather over comm == gather from outside: rc %d %s", rc, out);
        rc = run(
            "sh -c 'cp -a I J && rm -rf J/host-1 && %s run -n 2 -- unshare -m sh iso.sh J 2 %s ckpt gather J "
            "GJ && diff -r GJ GO'",
            cli, cli);
        TU_CHECK(rc == 0 && strstr(out, "using the copy on host 0"),
                 "isolated hosts, host 1's disk gone: gather from host 0's copies: rc %d %s", rc, out);
        rc = run("sh -c 'rm -rf J/host-1 J/host-0/step-0000012/shard-r00000.safetensors && %s run -n 2 -- "
                 "unshare -m sh iso.sh J 2 %s ckpt gather J GK && test -d GK/step-0000008 && "
                 "! test -e GK/step-0000012'",
                 cli, cli);
        TU_CHECK(rc == 0 && strstr(out, "gathered step 8") && strstr(out, "no intact copy of shard-r00000"),
                 "isolated hosts, a shard lost everywhere: the previous step: rc %d %s", rc, out);
        rc = run("env SUANLI_HOSTS=1 %s run -n 2 -- %s ckpt verify I", cli, cli);
        TU_CHECK(rc != 0 && strstr(out, "run one rank per host"), "ckpt tools: ranks != hosts refused: %s",
                 out);
        rc = run("%s run -n 2 -- %s ckpt verify base", cli, cli);
        TU_CHECK(rc != 0 && strstr(out, "a pooled store (--ckpt-local-dir) only"),
                 "ckpt tools under run: a plain checkpoint refused: %s", out);
        if (sl_ckpt_ec_available()) {
            rc = run(
                "sh -c '%s run -n 3 -- %s train " TINY3 " --save b3i && env SUANLI_FAULT_KILL_AT_STEP=9 "
                "SUANLI_FAULT_RANK=2 SUANLI_FAULT_LOSE_HOSTS=2 %s run -n 3 --max-restarts 1 -- unshare -m "
                "sh iso.sh I3 3 %s train " TINY3
                " --save e3i --load e3i --save-interval 3 --ckpt-local-dir I3 --ckpt-ec 2+1'",
                cli, cli, cli, cli);
            TU_CHECK(rc == 0 && strstr(out, "reassembled from I3 (3 hosts, ") && strstr(out, "rebuilding it"),
                     "isolated hosts, ec 2+1 over 3: rc %d %s", rc, out);
            TU_CHECK(same("b3i", "e3i"), "isolated hosts, ec 2+1, host 2 lost: final weights bitwise equal");
            /* a corrupted data block, found only once it has been streamed (Note [Pooled restore stream]):
             * the file is streamed again from the other two blocks and rebuilt, byte-identical to the
             * gather of the intact pool from outside */
            rc = run(
                "sh -c 'cp -a I3 K3 && s=$(cat K3/host-0/latest) && printf x | dd "
                "of=K3/host-0/$s/shard-r00000.safetensors.ec0 bs=1 seek=5000 conv=notrunc 2>/dev/null && "
                "%s ckpt gather I3 GO3 && %s run -n 3 -- unshare -m sh iso.sh K3 3 %s ckpt gather K3 GK3 && "
                "diff -r GK3 GO3'",
                cli, cli, cli);
            TU_CHECK(rc == 0 && strstr(out, "shard-r00000.safetensors.ec0 checksum mismatch") &&
                         strstr(out, "rebuilding it from 2 intact blocks"),
                     "isolated hosts, ec: a corrupt data block streamed, dropped, rebuilt: rc %d %s", rc,
                     out);
            /* inspect over comm surveys every block, streamed and checked on its own host */
            rc = run("%s run -n 3 -- unshare -m sh iso.sh K3 3 %s ckpt inspect K3", cli, cli);
            TU_CHECK(rc == 0 &&
                         strstr(out, "shard-r00000.safetensors block 0 on host 0: checksum mismatch") &&
                         strstr(out, "shard-r00000.safetensors block 2 (parity) on host 2: ok") &&
                         strstr(out, "shard-r00002.safetensors block 0 (data) on host 2: ok") &&
                         strstr(out, "can be rebuilt"),
                     "isolated hosts, ec: ckpt inspect over comm reports each block: rc %d %s", rc, out);
        }
    }
}

/* replicas 2 over 2 hosts: a lost host, a corrupt replica, a short shard, both copies damaged */
static void test_replicas(void) {
    int rc;
    /* ---- replicas 2 over 2 hosts (ranks 0,1 on host 0; 2,3 on host 1): rank 2 dies with its disk ---- */
    rc = run("env SUANLI_FAULT_KILL_AT_STEP=10 SUANLI_FAULT_RANK=2 SUANLI_FAULT_LOSE_HOSTS=1 %s run -n 4 "
             "--hosts 2 "
             "--max-restarts 1 -- %s train " TINY
             " --save rep --load rep --save-interval 4 --ckpt-local-dir L --ckpt-replicas 2",
             cli, cli);
    TU_CHECK(rc == 0 && strstr(out, "removing L/host-1") && strstr(out, "reassembled from L (2 hosts, ") &&
                 strstr(out, "missing; using the copy on host 0"),
             "replicas: lost host -> restart from the pool: rc %d %s", rc, out);
    TU_CHECK(!restore_left("L") && exists("L/host-0") && exists("L/host-1"),
             "replicas: the rebuilt .restore step removed once loaded (every host's)");
    TU_CHECK(same("base", "rep"),
             "replicas 2, host 1 lost: final weights bitwise equal to the uninterrupted run");
    rc = run("%s ckpt inspect L", cli);
    TU_CHECK(rc == 0 && strstr(out, "redundancy replicas 2") &&
                 strstr(out, "shard-r00003.safetensors copy on host 0: ok") && strstr(out, "can be rebuilt"),
             "inspect shows placement: %s", out);
    /* a gather that fails (no such step) made OUT and left it behind, empty */
    rc = run("sh -c '%s ckpt gather L Gnone --step 999; echo rc=$?; test -e Gnone && echo LEFT'", cli);
    TU_CHECK(strstr(out, "no host holds step-0000999") && strstr(out, "rc=2") && !strstr(out, "LEFT"),
             "gather --step 999: %s", out);

    /* a corrupted replica (the primary copy of rank 0's shard on host 0, newest step): detected, the copy on
     * host 1 is used; resuming with zero further steps reproduces the final weights */
    rc = run("sh -c 'f=L/host-0/step-0000012/shard-r00000.safetensors; printf \"\\\\377\" | dd of=$f bs=1 "
             "seek=$(($(stat -c %%s $f) - 64)) conv=notrunc 2>/dev/null && %s ckpt verify L'",
             cli);
    TU_CHECK(rc == 0 && strstr(out, "shard-r00000.safetensors checksum mismatch") &&
                 strstr(out, "using the copy on host 1") && strstr(out, "step-0000012 can be rebuilt"),
             "corrupt replica detected, other used: rc %d %s", rc, out);
    rc = run("%s run -n 4 --hosts 2 -- %s train " TINY
             " --save rep2 --load rep --ckpt-local-dir L --ckpt-replicas 2",
             cli, cli);
    /* the resume names the pool and the step it rebuilt, not the .restore dir it loaded (removed right
     * after: Note [Where a resume came from]) */
    TU_CHECK(rc == 0 && strstr(out, "resumed from pooled checkpoint L step-0000012 at step 12") &&
                 strstr(out, "checksum mismatch") && !strstr(out, "/.restore/"),
             "resume past a corrupt replica: rc %d %s", rc, out);
    TU_CHECK(!restore_left("L") && !exists("L/host-0/.restore"),
             "corrupt replica: .restore removed once loaded");
    TU_CHECK(same("base", "rep2"), "corrupt replica: resumed weights bitwise equal");
    /* host 0's config.json of the newest step lost: the restore takes the model config from the manifest
     * (it was copied from host 0 alone, so the restored step had none and the resume failed) */
    rc = run("sh -c 'rm L/host-0/step-0000012/config.json && %s run -n 4 --hosts 2 -- %s train " TINY
             " --save rep2c --load rep --ckpt-local-dir L --ckpt-replicas 2'",
             cli, cli);
    TU_CHECK(rc == 0 && strstr(out, "resumed from pooled checkpoint L step-0000012 at step 12"),
             "resume without host 0's config.json: rc %d %s", rc, out);
    TU_CHECK(same("base", "rep2c"), "lost config.json: resumed weights bitwise equal");
    /* a shard smaller than recorded */
    rc = run("sh -c 'truncate -s 1000 L/host-1/step-0000012/shard-r00002.safetensors && %s ckpt inspect L'",
             cli);
    TU_CHECK(rc == 0 && strstr(out, "shard-r00002.safetensors is 1000 bytes, smaller than the recorded"),
             "short shard named: rc %d %s", rc, out);
    /* both copies of one shard of step 12 damaged: falls back to step 8 */
    rc = run("sh -c 'truncate -s 1000 L/host-0/step-0000012/shard-r00002.safetensors && %s ckpt verify L'",
             cli);
    TU_CHECK(rc == 0 && strstr(out, "step-0000012 is not usable") &&
                 strstr(out, "no intact copy of shard-r00002") && strstr(out, "step-0000008 can be rebuilt"),
             "fallback to the previous complete checkpoint: rc %d %s", rc, out);
    /* leftovers of interrupted restores and saves (Note [Stale temp dirs] in src/ckpt/ckpt.c): a partial
     * .restore step, a host's step-N.tmpK; removed by the restart, a user's file beside them is not */
    rc = run(
        "sh -c 'mkdir -p L/host-0/.restore/step-0000099.tmp L/host-1/step-0000005.tmp2 && "
        "echo x > L/host-0/.restore/step-0000099.tmp/shard-r00000.safetensors && "
        "echo x > L/host-1/step-0000005.tmp2/shard-r00002.safetensors && echo keep > L/host-1/notes.tmp'");
    TU_CHECK(rc == 0, "plant leftovers: %s", out);
    rc = run("%s run -n 4 --hosts 2 -- %s train " TINY
             " --save rep3 --load rep3 --ckpt-local-dir L --ckpt-replicas 2",
             cli, cli);
    TU_CHECK(rc == 0 && strstr(out, "resumed from pooled checkpoint L step-0000008 at step 8"),
             "resume from step 8: rc %d %s", rc, out);
    TU_CHECK(!exists("L/host-0/.restore/step-0000099.tmp") && !exists("L/host-0/.restore/step-0000012") &&
                 !exists("L/host-0/.restore/step-0000008") && !restore_left("L") &&
                 !exists("L/host-1/step-0000005.tmp2") && exists("L/host-1/notes.tmp"),
             "stale .restore and step temp dirs removed, the restored step once loaded, a user file kept");
    TU_CHECK(same("base", "rep3"), "fallback to step 8: final weights bitwise equal");
}

/* the pool drained to --save in the background; retention per tier; the shared tier alone */
static void test_tiers(void) {
    int rc;
    /* ---- tiers: pooled + drained to --save in the background; retention per tier ---- */
    rc =
        run("%s run -n 4 --hosts 2 -- %s train " TINY
            " --save tier --save-interval 4 --ckpt-local-dir T --ckpt-replicas 2 --ckpt-shared --save-keep 3 "
            "--ckpt-local-keep 1",
            cli, cli);
    TU_CHECK(rc == 0 && exists("tier/step-0000004") && exists("tier/step-0000008") &&
                 exists("tier/step-0000012") && !exists("T/host-0/step-0000008") &&
                 exists("T/host-1/step-0000012"),
             "tiers: 3 steps kept under --save, 1 per host: rc %d %s", rc, out);
    /* the shared tier alone (every host lost) resumes bitwise */
    rc = run("sh -c 'rm -rf T && %s run -n 4 -- %s train " TINY " --save tier2 --load tier'", cli, cli);
    TU_CHECK(rc == 0 && strstr(out, "resumed from tier/step-0000012"), "resume from the shared tier: %s",
             out);
    TU_CHECK(same("base", "tier2"), "shared tier: resumed weights bitwise equal");
}

/* erasure code: a lost host, inspect, gather, corrupt and foreign blocks, old headers, too many lost */
static void test_ec(void) {
    int rc;
    /* ---- erasure code 2+1 over 4 hosts (each rank its own host): rank 1 dies with its disk ---- */
    if (sl_ckpt_ec_available()) {
        rc = run("env SUANLI_FAULT_KILL_AT_STEP=10 SUANLI_FAULT_RANK=1 SUANLI_FAULT_LOSE_HOSTS=1 %s run -n 4 "
                 "--max-restarts 1 -- %s train " TINY
                 " --save ec --load ec --save-interval 4 --ckpt-local-dir E --ckpt-ec 2+1",
                 cli, cli);
        TU_CHECK(rc == 0 && strstr(out, "reassembled from E (4 hosts, ") &&
                     strstr(out, "rebuilding it from 2 intact"),
                 "ec: lost host -> rebuilt: rc %d %s", rc, out);
        TU_CHECK(!restore_left("E"), "ec: the rebuilt .restore step removed once loaded");
        TU_CHECK(same("base", "ec"),
                 "ec 2+1, host 1 lost: final weights bitwise equal to the uninterrupted run");
        rc = run("%s ckpt inspect E", cli);
        TU_CHECK(rc == 0 && strstr(out, "redundancy ec 2+1") && strstr(out, "block 2 (parity) on host 2: ok"),
                 "ec inspect: %s", out);
        /* one host's directory given as a checkpoint: its step dirs hold blocks, not the shard files; the
         * error says so (it was a bare "shard-r00000.safetensors: cannot open") */
        rc = run("%s ckpt verify E/host-0/step-0000012", cli);
        TU_CHECK(rc == 2 && strstr(out, "a step dir of one host of a pooled store"),
                 "a host's step dir named as such: rc %d %s", rc, out);
        /* a parity block of another stripe (the same file of step 8) put in place of step 12's */
        rc = run("sh -c 'cp E/host-2/step-0000008/shard-r00000.safetensors.ec2 "
                 "E/host-2/step-0000012/shard-r00000.safetensors.ec2 && %s ckpt inspect E'",
                 cli);
        TU_CHECK(rc == 0 && strstr(out, "is block 2 of stripe 'step-0000008/shard-r00000.safetensors'") &&
                     strstr(out, "not block 2 of 'step-0000012/shard-r00000.safetensors'"),
                 "block of another stripe named: rc %d %s", rc, out);
        /* a gathered export loads like any checkpoint */
        rc = run("sh -c '%s ckpt gather E G && %s ckpt verify G'", cli, cli);
        TU_CHECK(rc == 0 && strstr(out, "gathered step 12") &&
                     strstr(out, "G/step-0000012: all checksums match"),
                 "gather: rc %d %s", rc, out);
        rc = run("%s train " TINY " --save fromg --load G", cli);
        TU_CHECK(rc == 0 && strstr(out, "resumed from G/step-0000012"), "train from the gathered dir: %s",
                 out);
        TU_CHECK(same("ec", "fromg"), "gathered checkpoint loads bitwise");
        rc = run("%s ckpt gather E G", cli);
        TU_CHECK(rc == 2 && strstr(out, "not empty"), "gather refuses a non-empty OUT: rc %d %s", rc, out);
        /* a corrupted data block read from the pool's directories (no comm: the blocks are fetched, not
         * streamed): it fails its checksum, is dropped, and the file is rebuilt from the other two blocks,
         * byte-identical to the gather of the intact pool (rank 1's shard: rank 0's has the wrong parity
         * block put in above) */
        rc = run(
            "sh -c 'cp -r E Ec && for b in Ec/host-*/step-0000012/shard-r00001.safetensors.ec0; do printf x "
            "| "
            "dd of=$b bs=1 seek=5000 conv=notrunc 2>/dev/null; done && %s ckpt gather Ec Gc && diff -r Gc G'",
            cli);
        TU_CHECK(rc == 0 && strstr(out, "shard-r00001.safetensors.ec0 checksum mismatch") &&
                     strstr(out, "rebuilding it from 2 intact blocks"),
                 "ec: a corrupt data block fetched from disk, dropped, rebuilt: rc %d %s", rc, out);
        /* a pool written before block headers were padded to 4096 bytes (128-byte headers, no
         * "block_header" in the manifest) still restores: the same blocks cut back to that layout */
        char script[700];
        snprintf(script, sizeof script, "%s/old.sh", dir);
        FILE *f = fopen(script, "w");
        if (f) {
            fputs("set -e\ncp -r E Eold\nfor b in Eold/host-*/step-*/*.ec[0-9]*; do\n"
                  "  { head -c 128 \"$b\"; tail -c +4097 \"$b\"; } > \"$b.x\"; mv \"$b.x\" \"$b\"\ndone\n"
                  "sed -i 's/\"block_header\":[[:space:]]*4096,//' Eold/host-*/step-*/manifest.json\n"
                  "! grep -q block_header Eold/host-*/step-*/manifest.json\n",
                  f);
            fclose(f);
        }
        rc = run("sh -c 'sh old.sh && %s ckpt gather Eold Gold && %s train " TINY
                 " --save fromold --load Gold'",
                 cli, cli);
        TU_CHECK(rc == 0 && strstr(out, "gathered step 12") && strstr(out, "resumed from Gold/step-0000012"),
                 "a pool with 128-byte block headers restores: rc %d %s", rc, out);
        TU_CHECK(same("ec", "fromold"), "the 128-byte-header pool loads bitwise");
        /* a manifest placing blocks on hosts not in the job: restart with 2 hosts */
        rc = run("%s run -n 4 --hosts 2 -- %s train " TINY
                 " --save ec2 --load ec2 --ckpt-local-dir E --ckpt-ec 1+1",
                 cli, cli);
        TU_CHECK(rc != 0 && strstr(out, "which is not in this job (hosts 0..1)"),
                 "host not in the job named: rc %d %s", rc, out);
        TU_CHECK(!exists("ec2"), "nothing written after the refused restore");
        /* more lost hosts than m = 1: every step loses blocks of rank 0's shard -> a clear failure */
        rc = run("sh -c 'rm -rf E/host-1 E/host-2 && %s run -n 4 -- %s train " TINY
                 " --save ec3 --load ec3 --ckpt-local-dir E --ckpt-ec 2+1'",
                 cli, cli);
        TU_CHECK(
            rc != 0 && strstr(out, "no complete pooled checkpoint") &&
                strstr(out, "shard-r00000.safetensors cannot be rebuilt: 1 of its 2+1 blocks are intact") &&
                strstr(out, "host 1: shard-r00000.safetensors.ec1 missing"),
            "too many lost hosts -> message naming the shard: rc %d %s", rc, out);
        /* 3 ranks = 3 hosts, 2+1: ZeRO-1 over 3 ranks also has bucket tails every rank owns and writes
         * (overlapping shards in the manifest) */
        rc = run(
            "sh -c '%s run -n 3 -- %s train " TINY3 " --save b3 && env SUANLI_FAULT_KILL_AT_STEP=9 "
            "SUANLI_FAULT_RANK=2 SUANLI_FAULT_LOSE_HOSTS=2 %s run -n 3 --max-restarts 1 -- %s train " TINY3
            " --save e3 --load e3 --save-interval 3 --ckpt-local-dir E3 --ckpt-ec 2+1'",
            cli, cli, cli, cli);
        TU_CHECK(rc == 0 && strstr(out, "reassembled from E3 (3 hosts, "), "ec 2+1 over 3 ranks: rc %d %s",
                 rc, out);
        TU_CHECK(same("b3", "e3"), "ec 2+1, 3 ranks, host 2 lost: final weights bitwise equal");
    } else {
        rc = run("%s run -n 4 -- %s train " TINY
                 " --save x --save-interval 4 --ckpt-local-dir E --ckpt-ec 2+1",
                 cli, cli);
        TU_CHECK(rc == 1 && strstr(out, "--ckpt-ec: this build has no erasure coding (install libisal-dev"),
                 "ec without ISA-L: rc %d %s", rc, out);
        printf("note: no ISA-L in this build; erasure-coding cases skipped\n");
    }
}

/* replicas over 4 hosts, 2 hosts lost: the shard without a copy is named */
static void test_replicas_lost_two(void) {
    int rc;
    /* ---- replicas over 4 hosts, 2 hosts lost: shard-r00001 (hosts 1, 2) is gone -> named ---- */
    rc = run(
        "sh -c '%s run -n 4 -- %s train " TINY
        " --save r4 --save-interval 6 --ckpt-local-dir R --ckpt-replicas 2 && rm -rf R/host-1 R/host-2 && "
        "%s run -n 4 -- %s train " TINY " --save r4 --load r4 --ckpt-local-dir R --ckpt-replicas 2'",
        cli, cli, cli, cli);
    TU_CHECK(rc != 0 &&
                 strstr(out, "no intact copy of shard-r00001.safetensors (host 1: shard-r00001.safetensors "
                             "missing; host 2: shard-r00001.safetensors missing)"),
             "replicas: too many lost hosts named: rc %d %s", rc, out);
}

/* a restore that fails because a host was lost or missed the communicators' deadline is a runtime failure
 * (exit 1, restarted by --max-restarts), one that finds no intact data is bad input (exit 2, not restarted):
 * Note [Peer failures in a pooled restore] in src/ckpt/pool.c. 2 ranks = 2 hosts, SUANLI_COMM_TIMEOUT=4. */
static void test_restore_peer(void) {
    int rc = run("%s run -n 2 --hosts 2 -- %s train " TINY
                 " --save pb --save-interval 4 --ckpt-local-dir P --ckpt-replicas 2",
                 cli, cli);
    TU_CHECK(rc == 0 && exists("P/host-1/step-0000012"), "restore peer: pooled run: rc %d %s", rc, out);
    /* host 1's leader silent for 6 s (> the 4 s deadline) right after the steps were listed: the deadline
     * passes for host 0, host 1 then finds its peer gone. Both exit 1 naming it (it was "no complete pooled
     * checkpoint", exit 2 on both, and the launcher refused to restart); the restart restores step 12 */
    rc = run(
        "env SUANLI_COMM_TIMEOUT=4 SUANLI_FAULT_RESTORE_STALL=1:6 %s run -n 2 --hosts 2 --max-restarts 1 -- "
        "%s train " TINY " --save pr --load pr --ckpt-local-dir P --ckpt-replicas 2",
        cli, cli);
    /* (host 1's own line depends on whether it wakes before host 0's job-wide all-reduce gives up, ~8 s:
     * either way exit 1, so only host 0's deadline message is required) */
    TU_CHECK(rc == 0 && strstr(out, "host 1's leader stalling 6 s") && strstr(out, "before the deadline") &&
                 strstr(out, "exited with status 1") && strstr(out, "restarting (1 of 1)") &&
                 !strstr(out, "no complete pooled checkpoint") && !strstr(out, "status 2") &&
                 strstr(out, "resumed from pooled checkpoint P step-0000012 at step 12"),
             "restore peer: a stalled host -> exit 1, restarted, restored: rc %d %s", rc, out);
    TU_CHECK(same("pb", "pr"), "restore peer: the restarted restore's weights bitwise equal");
    /* host 1's leader dies there: the survivor exits 1 naming the dead peer (each rank's status printed by
     * a wrapper; rank 1's wrapper exits 0 so that the launcher waits for rank 0's own status) */
    char w[700];
    snprintf(w, sizeof w, "%s/rc.sh", dir);
    FILE *f = fopen(w, "w");
    TU_CHECK(f != NULL, "write rc.sh");
    if (f) {
        fputs("\"$@\"; rc=$?; echo \"rank $RANK exit $rc\"; [ \"$RANK\" = 1 ] && exit 0; exit $rc\n", f);
        fclose(f);
    }
    rc = run("env SUANLI_COMM_TIMEOUT=4 SUANLI_FAULT_RESTORE_EXIT=1 %s run -n 2 --hosts 2 -- sh rc.sh %s "
             "train " TINY " --save px --load px --ckpt-local-dir P --ckpt-replicas 2",
             cli, cli);
    TU_CHECK(rc == 1 && strstr(out, "host 1's leader dying") && strstr(out, "rank 1 exit 137") &&
                 strstr(out, "rank 0 exit 1") && strstr(out, "died") &&
                 !strstr(out, "no complete pooled checkpoint") && !exists("px"),
             "restore peer: a lost host -> the survivor exits 1: rc %d %s", rc, out);
    /* the same pool with both copies of rank 0's shard damaged in every step: bad data, exit 2 on the
     * ranks, not restarted */
    rc = run(
        "sh -c 'cp -r P Q && for f in Q/host-*/step-*/shard-r00000.safetensors; do printf x | dd of=$f bs=1 "
        "seek=5000 conv=notrunc 2>/dev/null; done && %s run -n 2 --hosts 2 --max-restarts 1 -- %s train " TINY
        " --save pq --load pq --ckpt-local-dir Q --ckpt-replicas 2'",
        cli, cli);
    TU_CHECK(rc == 1 && strstr(out, "no complete pooled checkpoint") && strstr(out, "checksum mismatch") &&
                 strstr(out, "exited with status 2") && strstr(out, "not restarting") &&
                 !strstr(out, "restarting (1 of 1)") && !exists("pq"),
             "restore peer: damaged copies -> exit 2, not restarted: rc %d %s", rc, out);
}

/* `suanli ckpt inspect|verify|gather` under `suanli run` (one rank per host, the other hosts' files over the
 * network) when a transfer fails: a host lost (SUANLI_FAULT_RESTORE_EXIT) or silent past the deadline
 * (_STALL). Each surviving rank says that a peer host was lost, naming the peer's rank and (TCP) address, and
 * exits 1; the data was reported missing ("no host holds a readable manifest.json"), exit 2 like damaged
 * data (Note [Transfer failures] in src/ckpt/pool.c). Damaged copies stay exit 2. Uses test_restore_peer's
 * pools P (intact) and Q (rank 0's shard damaged in every step) and its rc.sh. */
static void test_tools_peer(void) {
    const char *env = "env SUANLI_COMM_TRANSPORT=tcp SUANLI_COMM_TIMEOUT=4";
    int rc = run("%s SUANLI_FAULT_RESTORE_EXIT=1 %s run -n 2 -- sh rc.sh %s ckpt inspect P", env, cli, cli);
    TU_CHECK(rc == 1 && strstr(out, "rank 1 exit 137") && strstr(out, "rank 0 exit 1") &&
                 strstr(out, "[0] suanli ckpt inspect: P: step-0000012: a peer host was lost or missed the "
                             "deadline (not missing or damaged data)") &&
                 strstr(out, "rank 1 (127.0.0.1:") && !strstr(out, "no host holds") &&
                 !strstr(out, "missing;"),
             "ckpt inspect, host 1 lost: a transfer failure naming the peer, exit 1: rc %d %s", rc, out);
    /* rank 0 is the lost host: rank 1 says so (only rank 0 used to print); rc0.sh: rc.sh with the ranks'
     * roles swapped, so that the launcher waits for rank 1's own status */
    char w[700];
    snprintf(w, sizeof w, "%s/rc0.sh", dir);
    FILE *f = fopen(w, "w");
    TU_CHECK(f != NULL, "write rc0.sh");
    if (f) {
        fputs("\"$@\"; rc=$?; echo \"rank $RANK exit $rc\"; [ \"$RANK\" = 0 ] && exit 0; exit $rc\n", f);
        fclose(f);
    }
    rc = run("%s SUANLI_FAULT_RESTORE_EXIT=0 %s run -n 2 -- sh rc0.sh %s ckpt verify P", env, cli, cli);
    TU_CHECK(rc == 1 && strstr(out, "rank 1 exit 1") &&
                 strstr(out, "[1] suanli ckpt verify: P: step-0000012: a peer host was lost") &&
                 strstr(out, "rank 0 (127.0.0.1:") && !strstr(out, "no complete pooled checkpoint"),
             "ckpt verify, host 0 lost: rank 1 reports the transfer failure, exit 1: rc %d %s", rc, out);
    rc = run("%s SUANLI_FAULT_RESTORE_STALL=1:6 %s run -n 2 -- sh rc.sh %s ckpt gather P GP", env, cli, cli);
    TU_CHECK(rc == 1 && strstr(out, "rank 0 exit 1") &&
                 strstr(out, "[0] suanli ckpt gather: P: step-0000012: a peer host was lost") &&
                 strstr(out, "no progress with rank 1 (127.0.0.1:") && !exists("GP"),
             "ckpt gather, host 1 silent past the deadline: a transfer failure, exit 1, no OUT: rc %d %s", rc,
             out);
    /* the data itself damaged: still exit 2 */
    rc = run("%s %s run -n 2 -- sh rc.sh %s ckpt verify Q", env, cli, cli);
    TU_CHECK(rc == 1 && strstr(out, "rank 0 exit 2") && strstr(out, "no complete pooled checkpoint") &&
                 strstr(out, "checksum mismatch") && !strstr(out, "peer host was lost"),
             "ckpt verify, damaged copies: exit 2: rc %d %s", rc, out);
}

/* bad flags: one line naming the flag, exit 2, nothing written */
static void test_bad_flags(void) {
    int rc;
    /* ---- bad flags: one line naming the flag, exit 2 (the launcher: 1 with the rank's 2), nothing written
     * ---- */
    rc = run("%s train " TINY " --save bad1 --save-interval 4 --ckpt-local-dir B --ckpt-ec 3", cli);
    TU_CHECK(rc == 2 && strstr(out, "--ckpt-ec: expected K+M"), "bad --ckpt-ec: rc %d %s", rc, out);
    rc = run("%s train " TINY " --save bad1 --save-interval 4 --ckpt-local-dir B --ckpt-replicas 2", cli);
    TU_CHECK(rc == 2 && strstr(out, "--ckpt-replicas 2: needs 1..1"), "too many replicas: rc %d %s", rc, out);
    rc = run("%s train " TINY " --save bad1 --save-interval 4 --ckpt-replicas 2", cli);
    TU_CHECK(rc == 2 && strstr(out, "--ckpt-replicas needs --ckpt-local-dir"), "replicas without dir: %s",
             out);
    rc = run("%s train " TINY " --save bad1 --save-interval 4 --ckpt-shared", cli);
    TU_CHECK(rc == 2 && strstr(out, "--ckpt-shared needs --ckpt-local-dir"), "shared without dir: %s", out);
    /* the pool commits only beside --save's writer: without --save nothing was saved */
    rc = run("%s train " TINY " --save-interval 4 --ckpt-local-dir B --ckpt-replicas 1", cli);
    TU_CHECK(rc == 2 && strstr(out, "--save-interval 4 needs --save (") && strstr(out, "--ckpt-local-dir"),
             "pooled --save-interval without --save: rc %d %s", rc, out);
    rc = run("%s train " TINY " --save bad1 --ckpt-local-dir B --ckpt-replicas 1 --ckpt-ec 1+1", cli);
    TU_CHECK(rc == 2 && strstr(out, "not both"), "replicas and ec: %s", out);
    rc = run("env SUANLI_HOSTS=x %s train " TINY " --save bad1 --ckpt-local-dir B", cli);
    TU_CHECK(rc == 2 && strstr(out, "SUANLI_HOSTS=x"), "bad SUANLI_HOSTS: %s", out);
    /* more hosts than ranks (one process here): the bound survived a mutation audit */
    rc = run("env SUANLI_HOSTS=2 %s train " TINY " --save bad1 --ckpt-local-dir B", cli);
    TU_CHECK(rc == 2 && strstr(out, "SUANLI_HOSTS=2: expected a host count in 1..1"),
             "SUANLI_HOSTS above the ranks: %s", out);
    rc = run("%s run -n 2 --hosts 3 -- true", cli);
    TU_CHECK(rc == 2 && strstr(out, "--hosts: 3 exceeds the job's 2 ranks"), "run --hosts too many: %s", out);
    TU_CHECK(!exists("bad1") && !exists("B"), "no output written after bad flags");
}

int main(void) {
    cli = tu_cli();
    snprintf(dir, sizeof dir, "%s", tu_tmpdir("ckpt_pool"));
    int rc = run("sh -c 'head -c 20000 %s/data/tinyshakespeare.txt > s.txt && %s data prepare --input s.txt "
                 "--output-prefix data'",
                 SL_SOURCE_DIR, cli);
    TU_CHECK(rc == 0, "prepare: %s", out);
    rc = run("%s run -n 4 -- %s train " TINY " --save base", cli, cli);
    TU_CHECK(rc == 0, "baseline: %s", out);

    test_replicas();
    test_tiers();
    test_ec();
    test_replicas_lost_two();
    isolated_hosts();
    test_restore_peer();
    test_tools_peer();
    test_bad_flags();

    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (tu_failures == 0) TU_CHECK(system(cmd) == 0, "cleanup");
    return tu_finish("test_ckpt_pool");
}
