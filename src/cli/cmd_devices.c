/* suanli devices — the registered backends and the devices each runtime reports (OpenCL platforms and
 * devices; CUDA when a CUDA backend is built), from sl_device_inventory_get (src/device/registry.c).
 * This file only formats. --json prints one object. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "suanli/device.h"

static void mib(char *dst, size_t cap, int64_t bytes) {
    if (bytes < 0)
        snprintf(dst, cap, "?");
    else if (bytes >= (int64_t)1 << 30)
        snprintf(dst, cap, "%.2f GiB", (double)bytes / (1 << 30));
    else
        snprintf(dst, cap, "%.0f KiB", (double)bytes / 1024);
}

/* s as a JSON string body (quotes and backslashes escaped, control characters dropped) */
static void jstr(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') putchar('\\');
        if ((unsigned char)*s >= 0x20) putchar(*s);
    }
    putchar('"');
}

int sl_cmd_devices(int argc, char **argv) {
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: suanli devices [--json]\n"
                   "lists the backends (--device NAME) and the devices of each runtime (--device NAME:N)\n");
            return 0;
        } else {
            fprintf(stderr, "suanli devices: unknown flag '%s'\n", argv[i]);
            return 2;
        }
    }
    static sl_device_inventory inv;
    sl_device_inventory_get(&inv);
    if (json) {
        printf("{\"runtimes\":[");
        for (int i = 0; i < inv.n_runtimes; i++) {
            const sl_runtime_info *r = &inv.runtimes[i];
            printf("%s{\"name\":", i ? "," : "");
            jstr(r->name);
            printf(",\"built\":%s,\"n_devices\":%d,\"note\":", r->built ? "true" : "false", r->n_devices);
            jstr(r->note);
            printf("}");
        }
        printf("],\"devices\":[");
        for (int i = 0; i < inv.n_devices; i++) {
            const sl_device_info *d = &inv.devices[i];
            printf("%s{\"device\":\"%s:%d\",\"platform\":", i ? "," : "", d->backend, d->index);
            jstr(d->platform);
            printf(",\"name\":");
            jstr(d->name);
            printf(",\"vendor\":");
            jstr(d->vendor);
            printf(",\"driver\":");
            jstr(d->driver);
            printf(",\"version\":");
            jstr(d->version);
            printf(",\"type\":\"%s\",\"compute_units\":%d,\"global_mem\":%lld,\"local_mem\":%lld,"
                   "\"max_alloc\":%lld,\"max_work_group\":%lld,\"fp64\":%s,\"fp16\":%s}",
                   d->type, d->compute_units, (long long)d->global_mem, (long long)d->local_mem,
                   (long long)d->max_alloc, (long long)d->max_work_group, d->fp64 ? "true" : "false",
                   d->fp16 ? "true" : "false");
        }
        printf("]}\n");
        return 0;
    }
    printf("backends (--device NAME):\n");
    for (int i = 0; i < inv.n_runtimes; i++) {
        const sl_runtime_info *r = &inv.runtimes[i];
        printf("  %-7s %s\n", r->name, r->note);
        if (!strcmp(r->name, "opencl") && r->built) {
            for (int j = 0; j < inv.n_devices; j++) {
                const sl_device_info *d = &inv.devices[j];
                if (strcmp(d->backend, "opencl")) continue;
                char g[32], l[32], a[32];
                mib(g, sizeof g, d->global_mem);
                mib(l, sizeof l, d->local_mem);
                mib(a, sizeof a, d->max_alloc);
                printf("    opencl:%d  %s\n", d->index, d->name);
                printf("      platform %s; vendor %s; driver %s; %s\n", d->platform, d->vendor, d->driver,
                       d->version);
                printf("      type %s, %d compute units, global memory %s (max allocation %s), local memory "
                       "%s, max work-group %lld, fp64 %s, fp16 %s\n",
                       d->type, d->compute_units, g, a, l, (long long)d->max_work_group,
                       d->fp64 ? "yes" : "no", d->fp16 ? "yes" : "no");
            }
        }
    }
    return 0;
}
