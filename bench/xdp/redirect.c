/* oxvs-bench's `xdp-redirect` switch kind: the kernel XDP ceiling.
 *
 * Attached natively (`ip link set dev X xdpdrv obj redirect.o sec xdp`) on
 * both host-side veths of the virtual setup (or both --dut-ports); every
 * frame received on IFINDEX_A is redirected to IFINDEX_B and vice versa,
 * anything else passes. oxvs-bench compiles it at run time with the two
 * ifindexes as macros:
 *
 *   clang -O2 -target bpf -DIFINDEX_A=N -DIFINDEX_B=M -c redirect.c -o F
 *
 * No headers (the machine may have no kernel BTF nor libbpf headers): the
 * few definitions needed are spelled out below, matching the kernel UAPI
 * (linux/bpf.h: enum xdp_action, struct xdp_md, BPF_FUNC_redirect = 23).
 */

typedef unsigned int u32;
typedef unsigned long long u64;

struct xdp_md {
	u32 data;
	u32 data_end;
	u32 data_meta;
	u32 ingress_ifindex;
	u32 rx_queue_index;
	u32 egress_ifindex;
};

#define XDP_PASS 2
#define XDP_REDIRECT 4

static long (*bpf_redirect)(u32 ifindex, u64 flags) = (void *)23;

#ifndef IFINDEX_A
#error "IFINDEX_A must be defined"
#endif
#ifndef IFINDEX_B
#error "IFINDEX_B must be defined"
#endif

__attribute__((section("xdp"), used))
int xdp_redirect_peer(struct xdp_md *ctx)
{
	u32 in = ctx->ingress_ifindex;

	if (in == IFINDEX_A)
		return bpf_redirect(IFINDEX_B, 0);
	if (in == IFINDEX_B)
		return bpf_redirect(IFINDEX_A, 0);
	return XDP_PASS;
}

char _license[] __attribute__((section("license"), used)) = "GPL";
