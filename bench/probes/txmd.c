// Probe: does copy-mode AF_XDP honour the TX metadata checksum request on this
// kernel? Sends one UDP datagram whose checksum field holds only the
// pseudo-header sum (what CHECKSUM_PARTIAL expects) out of an AF_XDP socket on
// IF, with (argv[3]=1) or without (0) XDP_TXMD_FLAGS_CHECKSUM. Run by txmd.sh.
#include <linux/if_xdp.h>
#include <linux/if_ether.h>
#include <net/if.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <unistd.h>
#include <errno.h>
#include <arpa/inet.h>
#ifndef XDP_UMEM_TX_METADATA_LEN
#define XDP_UMEM_TX_METADATA_LEN (1 << 2)
#endif
#define XDP_TXMD_FLAGS_CHECKSUM_ (1 << 1)
#define XDP_TX_METADATA_ (1 << 1)
struct umem_reg { uint64_t addr, len; uint32_t chunk_size, headroom, flags, tx_metadata_len; };
struct txmd { uint64_t flags; uint16_t csum_start, csum_offset; uint32_t pad; uint64_t launch; };
static uint32_t sum16(const uint8_t *p, int n, uint32_t s) { for (int i = 0; i + 1 < n; i += 2) s += (p[i] << 8) | p[i+1]; if (n & 1) s += p[n-1] << 8; return s; }
static uint16_t fold(uint32_t s) { while (s >> 16) s = (s & 0xffff) + (s >> 16); return s; }
int main(int argc, char **argv) {
  const char *ifn = argv[1]; const char *dmac = argv[2]; int md = atoi(argv[3]);
  int fd = socket(AF_XDP, SOCK_RAW, 0); if (fd < 0) { perror("socket"); return 1; }
  size_t sz = 64 * 4096; uint8_t *mem = mmap(0, sz, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
  struct umem_reg mr = { (uintptr_t)mem, sz, 4096, 0, md ? XDP_UMEM_TX_METADATA_LEN : 0, md ? 24 : 0 };
  if (setsockopt(fd, SOL_XDP, XDP_UMEM_REG, &mr, sizeof mr)) { perror("UMEM_REG"); return 1; }
  int n = 64;
  setsockopt(fd, SOL_XDP, XDP_UMEM_FILL_RING, &n, 4); setsockopt(fd, SOL_XDP, XDP_UMEM_COMPLETION_RING, &n, 4);
  setsockopt(fd, SOL_XDP, XDP_TX_RING, &n, 4);
  struct xdp_mmap_offsets off; socklen_t ol = sizeof off;
  if (getsockopt(fd, SOL_XDP, XDP_MMAP_OFFSETS, &off, &ol)) { perror("offsets"); return 1; }
  uint8_t *tx = mmap(0, off.tx.desc + n * sizeof(struct xdp_desc), PROT_READ|PROT_WRITE, MAP_SHARED|MAP_POPULATE, fd, XDP_PGOFF_TX_RING);
  uint8_t *cq = mmap(0, off.cr.desc + n * 8, PROT_READ|PROT_WRITE, MAP_SHARED|MAP_POPULATE, fd, XDP_UMEM_PGOFF_COMPLETION_RING);
  if (tx == MAP_FAILED || cq == MAP_FAILED) { perror("mmap"); return 1; }
  struct sockaddr_xdp sa = { .sxdp_family = AF_XDP, .sxdp_ifindex = if_nametoindex(ifn), .sxdp_queue_id = 0, .sxdp_flags = XDP_COPY };
  if (bind(fd, (void *)&sa, sizeof sa)) { perror("bind"); return 1; }
  // Frame at 256: Ethernet, IPv4 10.99.0.1 -> 10.99.0.2, UDP 7777 -> 9999, 1000 bytes payload.
  uint64_t addr = 256; uint8_t *f = mem + addr; int plen = 1000, len = 14 + 20 + 8 + plen;
  unsigned m[6]; sscanf(dmac, "%x:%x:%x:%x:%x:%x", &m[0],&m[1],&m[2],&m[3],&m[4],&m[5]);
  for (int i = 0; i < 6; i++) { f[i] = m[i]; f[6+i] = 0x02; } f[12] = 0x08; f[13] = 0;
  uint8_t *ip = f + 14; memset(ip, 0, 20); ip[0] = 0x45; ip[2] = (20+8+plen) >> 8; ip[3] = (20+8+plen) & 0xff; ip[8] = 64; ip[9] = 17;
  inet_pton(AF_INET, "10.99.0.1", ip + 12); inet_pton(AF_INET, "10.99.0.2", ip + 16);
  uint16_t ic = ~fold(sum16(ip, 20, 0)); ip[10] = ic >> 8; ip[11] = ic & 0xff;
  uint8_t *u = ip + 20; u[0] = 7777 >> 8; u[1] = 7777 & 0xff; u[2] = 9999 >> 8; u[3] = 9999 & 0xff; u[4] = (8+plen) >> 8; u[5] = (8+plen) & 0xff;
  for (int i = 0; i < plen; i++) u[8+i] = i * 7;
  // Pseudo-header sum only (not complemented), as a CHECKSUM_PARTIAL sender leaves it.
  uint32_t ps = sum16(ip + 12, 8, 0) + 17 + 8 + plen; uint16_t p = fold(ps); u[6] = p >> 8; u[7] = p & 0xff;
  if (md) { struct txmd *t = (void *)(mem + addr - 24); memset(t, 0, 24); t->flags = XDP_TXMD_FLAGS_CHECKSUM_; t->csum_start = 14 + 20; t->csum_offset = 6; }
  uint32_t *prod = (void *)(tx + off.tx.producer); struct xdp_desc *d = (void *)(tx + off.tx.desc);
  d[0].addr = addr; d[0].len = len; d[0].options = md ? XDP_TX_METADATA_ : 0;
  __atomic_store_n(prod, 1, __ATOMIC_RELEASE);
  if (sendto(fd, 0, 0, MSG_DONTWAIT, 0, 0) < 0) perror("sendto");
  usleep(100000);
  uint32_t cprod = __atomic_load_n((uint32_t *)(cq + off.cr.producer), __ATOMIC_ACQUIRE);
  struct xdp_statistics st; socklen_t sl = sizeof st; getsockopt(fd, SOL_XDP, XDP_STATISTICS, &st, &sl);
  printf("metadata=%d completed=%u tx_invalid=%llu\n", md, cprod, (unsigned long long)st.tx_invalid_descs);
  return 0;
}
