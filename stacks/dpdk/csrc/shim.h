/* The DPDK calls uniplane needs, through one header bindgen reads.
 * The hot paths of DPDK are static inline functions that no library
 * exports; shim.c wraps them, a burst per call. */
#ifndef UNIPLANE_DPDK_SHIM_H
#define UNIPLANE_DPDK_SHIM_H

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>

/* rte_errno of the calling thread. */
int up_errno(void);
/* rte_eth_rx_burst. */
uint16_t up_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n);
/* rte_eth_tx_burst. */
uint16_t up_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n);
/* rte_mempool_get_bulk: mbufs for transmission, not yet reset. */
int up_get_bulk(struct rte_mempool *pool, struct rte_mbuf **pkts, unsigned n);
/* rte_pktmbuf_free_bulk. */
void up_free_bulk(struct rte_mbuf **pkts, unsigned n);
/* Data pointer and length of each received mbuf; a chained mbuf (more
 * than one segment) gets length 0. */
void up_rx_frames(struct rte_mbuf **pkts, uint16_t n, uint8_t **data, uint16_t *len);
/* What a transmit resets in an mbuf taken from the pool, so Rust does it
 * as it writes the frame, with no call: the offsets of buf_addr,
 * data_off, ol_flags, packet_type, pkt_len, data_len and vlan_tci; the
 * headroom data_off is reset to; the ol_flags bits kept. The rest is as
 * rte_pktmbuf_free left it (next NULL, nb_segs 1, refcnt 1), and the Tx
 * offload fields are ignored while ol_flags asks for no offload — the
 * lighter reset testpmd's txonly engine makes. */
void up_tx_layout(size_t off[7], uint16_t *headroom, uint64_t *keep_flags);
/* Bytes an mbuf of the pool holds after its headroom. */
uint16_t up_data_room(struct rte_mempool *pool);
/* The calling thread's lcore id (LCORE_ID_ANY outside EAL threads). */
unsigned up_lcore_id(void);

#endif
