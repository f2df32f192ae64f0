/* The checks of the bootstrap and TCP handshake messages (src/comm/wire.c): what a rank accepts from a
 * connection before it trusts it. Exact oracle: each case is accepted or refused by construction. */
#include <string.h>

#include "comm/wire.h"
#include "testutil.h"

static const char tok[] = "0123456789abcdef0123456789abcdef";

static sl_wire_boot_hello boot(uint32_t magic, uint32_t rank, uint32_t size, const char *t) {
    sl_wire_boot_hello h;
    memset(&h, 0, sizeof h);
    h.magic = magic, h.rank = rank, h.size = size;
    memcpy(h.token, t, strlen(t) < sizeof h.token ? strlen(t) : sizeof h.token);
    return h;
}

int main(void) {
    /* bootstrap hello: rank 0 of a world of 4 */
    sl_wire_boot_hello h = boot(SL_WIRE_BOOT_MAGIC, 2, 4, tok);
    TU_CHECK(sl_wire_boot_hello_rank(&h, sizeof h, tok, 4) == 2, "valid hello -> rank 2");
    TU_CHECK(sl_wire_boot_hello_rank(&h, sizeof h - 1, tok, 4) == -1, "short message refused");
    TU_CHECK(sl_wire_boot_hello_rank(&h, sizeof h, tok, 3) == -1, "world size mismatch refused");
    TU_CHECK(sl_wire_boot_hello_rank(&h, sizeof h, "another-token", 4) == -1, "foreign token refused");
    h = boot(SL_WIRE_BOOT_MAGIC ^ 1, 2, 4, tok);
    TU_CHECK(sl_wire_boot_hello_rank(&h, sizeof h, tok, 4) == -1, "bad magic refused");
    h = boot(SL_WIRE_BOOT_MAGIC, 0, 4, tok);
    TU_CHECK(sl_wire_boot_hello_rank(&h, sizeof h, tok, 4) == -1, "rank 0 (the server's) refused");
    h = boot(SL_WIRE_BOOT_MAGIC, 4, 4, tok);
    TU_CHECK(sl_wire_boot_hello_rank(&h, sizeof h, tok, 4) == -1, "rank == size refused");
    h = boot(SL_WIRE_BOOT_MAGIC, 0xffffffffu, 4, tok);
    TU_CHECK(sl_wire_boot_hello_rank(&h, sizeof h, tok, 4) == -1, "rank 2^32-1 refused");
    h = boot(SL_WIRE_BOOT_MAGIC, 2, 4, tok);
    memset(h.token, 'a', sizeof h.token); /* no NUL in the token field */
    TU_CHECK(sl_wire_boot_hello_rank(&h, sizeof h, tok, 4) == -1, "unterminated token refused");

    /* tcp hello: rank 1 of 4 accepts ranks 2 and 3 only */
    sl_wire_tcp_hello t;
    memset(&t, 0, sizeof t);
    t.magic = SL_WIRE_TCP_MAGIC;
    memcpy(t.token, tok, sizeof tok);
    for (uint32_t r = 0; r < 6; r++) {
        t.rank = r;
        int want = (r == 2 || r == 3) ? (int)r : -1;
        TU_CHECK(sl_wire_tcp_hello_rank(&t, sizeof t, tok, 1, 4) == want, "tcp hello rank %u -> %d", r, want);
    }

    /* tcp address entries (the fix: an ip field without a NUL was passed to getaddrinfo and read past) */
    sl_wire_tcp_addr a;
    memset(&a, 0, sizeof a);
    strcpy(a.ip, "127.0.0.1");
    a.port = 29500;
    TU_CHECK(sl_wire_tcp_addr_check(&a, sizeof a, 3) == SL_OK, "valid address: %s", sl_errmsg());
    a.port = 0;
    TU_CHECK(sl_wire_tcp_addr_check(&a, sizeof a, 3) == SL_ERR_PEER && strstr(sl_errmsg(), "rank 3"),
             "port 0 refused, naming the rank: %s", sl_errmsg());
    a.port = 65536;
    TU_CHECK(sl_wire_tcp_addr_check(&a, sizeof a, 3) == SL_ERR_PEER, "port 65536 refused");
    a.port = 1;
    memset(a.ip, '1', sizeof a.ip);
    TU_CHECK(sl_wire_tcp_addr_check(&a, sizeof a, 3) == SL_ERR_PEER && strstr(sl_errmsg(), "NUL"),
             "unterminated ip refused: %s", sl_errmsg());
    memset(a.ip, 0, sizeof a.ip);
    TU_CHECK(sl_wire_tcp_addr_check(&a, sizeof a, 3) == SL_ERR_PEER, "empty ip refused");
    strcpy(a.ip, "10.0.0.1\n");
    TU_CHECK(sl_wire_tcp_addr_check(&a, sizeof a, 3) == SL_ERR_PEER, "control byte refused");
    strcpy(a.ip, "10.0.0.1 ");
    TU_CHECK(sl_wire_tcp_addr_check(&a, sizeof a, 3) == SL_ERR_PEER && strstr(sl_errmsg(), "0x20"),
             "a space (0x20, the first printable byte) refused: %s", sl_errmsg());
    strcpy(a.ip, "10.0.0.1~");
    TU_CHECK(sl_wire_tcp_addr_check(&a, sizeof a, 3) == SL_OK, "'~' (the last printable byte) accepted: %s",
             sl_errmsg());
    return tu_finish("test_comm_wire");
}
