/* suanli/device.h — the backend contract. A backend is a struct of function pointers.
 *
 * Usage:
 *   sl_backend *be = sl_backend_get("cpu");           // borrowed, lives for the process
 *   sl_buffer *buf; sl_backend_alloc(be, bytes, &buf);
 *   void *p = be->buffer_base(buf);                   // device address (host pointer for CPU)
 *   be->copy_in(buf, 0, host, bytes);
 *   if (be->supports_op(be, node)) be->compute_node(be, node);
 *   sl_backend_free(be, buf);
 *
 * Adding a backend: copy src/device/null/, fill in the members, give an honest supports_op, add one
 * line to the registry in src/device/registry.c. Optional members may be NULL.
 */
#ifndef SUANLI_DEVICE_H
#define SUANLI_DEVICE_H

#include "suanli/base.h"
#include "suanli/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sl_buffer {
    struct sl_backend *backend;
    void *base; /* device address */
    size_t size;
    void *impl; /* backend-private */
} sl_buffer;

struct sl_backend {
    const char *name;
    void *impl; /* backend-private state */
    /* memory */
    sl_status (*buffer_alloc)(struct sl_backend *be, size_t bytes, sl_buffer **out);
    void (*buffer_free)(struct sl_backend *be, sl_buffer *buf);
    void *(*buffer_base)(sl_buffer *buf);
    sl_status (*copy_in)(sl_buffer *dst, size_t offset, const void *host, size_t bytes);
    sl_status (*copy_out)(const sl_buffer *src, size_t offset, void *host, size_t bytes);
    sl_status (*memset_zero)(sl_buffer *buf, size_t offset, size_t bytes); /* optional */
    sl_status (*synchronize)(struct sl_backend *be);                       /* optional */
    /* compute */
    int (*supports_op)(struct sl_backend *be, const sl_tensor *node);
    sl_status (*compute_node)(struct sl_backend *be, sl_tensor *node);
    /* optional: run nodes [start,end) of a graph at once (fusion, launch batching). If NULL the
     * executor calls compute_node per node. */
    sl_status (*graph_compute)(struct sl_backend *be, sl_graph *g, int start, int end, sl_node_hook hook,
                               void *user);
};

/* Registry: "cpu" always; "null" as the template. Returns NULL (with sl_errmsg) if unknown. */
sl_backend *sl_backend_get(const char *name);
sl_backend *sl_backend_cpu(void);
sl_backend *sl_backend_null(void);

sl_status sl_backend_alloc(sl_backend *be, size_t bytes, sl_buffer **out);
void sl_backend_free(sl_backend *be, sl_buffer *buf);

#ifdef __cplusplus
}
#endif
#endif
