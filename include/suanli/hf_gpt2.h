/* suanli/hf_gpt2.h — GPT-2 weights from/to a Hugging Face directory (config.json + model.safetensors,
 * GPT2LMHeadModel layout: Conv1D weights stored (in, out), optional "transformer." prefix, tied head).
 *
 * Usage:
 *   sl_model *m; sl_hf_gpt2_import("gpt2-dir", &m);     // suanli layout (nn.Linear (out, in))
 *   sl_hf_gpt2_export(m, "out-dir");                    // loadable by transformers' from_pretrained
 */
#ifndef SUANLI_HF_GPT2_H
#define SUANLI_HF_GPT2_H
#include "suanli/hf.h"
#include "suanli/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

sl_status sl_hf_gpt2_import(const char *dir, sl_model **out);
/* The same, with the bos/eos ids and dropouts of its config.json into info (may be NULL). */
sl_status sl_hf_gpt2_import_ex(const char *dir, sl_model **out, sl_hf_info *info);
sl_status sl_hf_gpt2_export(const sl_model *m, const char *dir);
/* The same, config.json recording info's bos/eos ids and dropouts (info may be NULL) */
sl_status sl_hf_gpt2_export_ex(const sl_model *m, const char *dir, const sl_hf_info *info);

#ifdef __cplusplus
}
#endif
#endif
