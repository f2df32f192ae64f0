/* suanli/model_io.h — save/load model weights as safetensors + config.json in a directory.
 *
 * Usage:
 *   sl_model_save(m, "out/", NULL);        // out/model.safetensors, out/config.json (atomic each)
 *   sl_model *m2; sl_model_load("out/", &m2);
 */
#ifndef SUANLI_MODEL_IO_H
#define SUANLI_MODEL_IO_H
#include "suanli/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes DIR/model.safetensors and DIR/config.json. extra_json: optional JSON object text whose keys
 * are added to config.json under "train" (e.g. the training arguments). */
sl_status sl_model_save(const sl_model *m, const char *dir, const char *extra_json);
/* Reads DIR/config.json, checks it, creates the model and loads every tensor (shape and dtype checked). */
sl_status sl_model_load(const char *dir, sl_model **out);
/* Reads only the config (for checks before allocating). */
sl_status sl_model_load_config(const char *dir, sl_gpt2_config *cfg);
/* Checks that DIR/config.json (a checkpoint's model record: architecture, n_layer, n_head, n_embd,
 * vocab_size, max_seq_len) describes model m; one-line error naming the field otherwise. */
sl_status sl_model_check_config(const char *dir, const sl_model *m);
/* Load weights from a safetensors file into an existing model (names/shapes must match). */
sl_status sl_model_load_weights(sl_model *m, const char *path);

#ifdef __cplusplus
}
#endif
#endif
