/* suanli/suanli.h — the whole public API in one include (every header under include/suanli/).
 *
 * Usage:
 *   #include <suanli/suanli.h>
 *   printf("suanli %s\n", sl_version());
 *   sl_model *m; sl_hf_info info;
 *   if (sl_hf_load("path/to/hf-dir", &m, &info) != SL_OK) fprintf(stderr, "%s\n", sl_errmsg());
 *
 * Build: `cc app.c $(pkg-config --cflags --libs suanli)` or, in CMake, find_package(suanli) and link
 * suanli::suanli (shared) or suanli::suanli_static. Complete programs: examples/ (built by CI).
 * tests/unit/check_headers.sh checks that this file includes every public header.
 */
#ifndef SUANLI_SUANLI_H
#define SUANLI_SUANLI_H

#include "suanli/version.h"

#include "suanli/base.h"
#include "suanli/ckpt.h"
#include "suanli/ckpt_trainer.h"
#include "suanli/comm.h"
#include "suanli/data.h"
#include "suanli/device.h"
#include "suanli/graph.h"
#include "suanli/hf.h"
#include "suanli/hf_gpt2.h"
#include "suanli/metrics.h"
#include "suanli/model_io.h"
#include "suanli/nn.h"
#include "suanli/ops.h"
#include "suanli/optim.h"
#include "suanli/parallel.h"
#include "suanli/plan.h"
#include "suanli/safetensors.h"
#include "suanli/tensor.h"
#include "suanli/train.h"

#endif
