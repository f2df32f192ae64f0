/* CLI subcommands. Each returns a process exit code: 0 ok, 2 bad input/usage, 1 runtime failure. */
#ifndef SL_CLI_COMMANDS_H
#define SL_CLI_COMMANDS_H
int sl_cmd_train(int argc, char **argv);    /* cmd_train.c */
int sl_cmd_generate(int argc, char **argv); /* cmd_generate.c */
int sl_cmd_data(int argc, char **argv);     /* cmd_data.c: suanli data prepare ... */
int sl_cmd_run(int argc, char **argv);      /* cmd_run.c: launcher */
int sl_cmd_bench(int argc, char **argv);    /* cmd_bench.c: ops | comm | train */
int sl_cmd_ckpt(int argc, char **argv);     /* cmd_ckpt.c: inspect | verify */
int sl_cmd_convert(int argc, char **argv);  /* cmd_convert.c: HF <-> HF (f32|bf16), GPT-2 HF <-> suanli */
int sl_cmd_plot(int argc, char **argv);     /* cmd_plot.c: metrics.jsonl -> SVG */
int sl_cmd_devices(int argc, char **argv);  /* cmd_devices.c: backends, OpenCL platforms and devices */
int sl_cmd_plan(int argc, char **argv);     /* cmd_plan.c: layout planner, checkpoint interval, failures */
int sl_cmd_topo(int argc, char **argv);     /* cmd_topo.c: hosts, NUMA nodes, cores, caches (hwloc) */
int sl_cmd_submit(int argc, char **argv);   /* cmd_submit.c: sbatch script for a training command */
#endif
