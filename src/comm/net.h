/* Small blocking-with-deadline socket helpers (libc only) for bootstrap and the TCP transport. */
#ifndef SL_COMM_NET_H
#define SL_COMM_NET_H
#include "comm/comm_internal.h"
/* Listen on port (0 = ephemeral) on all interfaces; *port_out gets the port. */
sl_status sl_net_listen(int port, int *fd_out, int *port_out);
/* Connect, retrying until the deadline (the server may not be up yet). */
sl_status sl_net_connect(const char *addr, int port, double deadline, int *fd_out);
/* Accept one connection before the deadline. */
sl_status sl_net_accept(int lfd, double deadline, int *fd_out);
/* Read/write exactly n bytes before the deadline. `who` names the peer in messages. */
sl_status sl_net_write_full(int fd, const void *buf, size_t n, double deadline, const char *who);
sl_status sl_net_read_full(int fd, void *buf, size_t n, double deadline, const char *who);
void sl_net_tune(int fd); /* TCP_NODELAY, big buffers */
#endif
