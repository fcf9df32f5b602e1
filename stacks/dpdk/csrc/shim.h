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
/* Mbufs for transmission (a lighter rte_pktmbuf_alloc_bulk), and each
 * one's data pointer into data[]. */
int up_alloc_bulk(struct rte_mempool *pool, struct rte_mbuf **pkts, unsigned n, uint8_t **data);
/* rte_pktmbuf_free_bulk. */
void up_free_bulk(struct rte_mbuf **pkts, unsigned n);
/* Data pointer and length of each received mbuf; a chained mbuf (more
 * than one segment) gets length 0. */
void up_rx_frames(struct rte_mbuf **pkts, uint16_t n, uint8_t **data, uint16_t *len);
/* Sets data_len and pkt_len of each mbuf before transmission. */
void up_tx_lengths(struct rte_mbuf **pkts, uint16_t n, const uint16_t *len);
/* Where pkt_len (32 bits), data_len and vlan_tci (16 bits each) lie in
 * an mbuf, so Rust sets the lengths as it writes a frame, with no call. */
void up_len_offsets(size_t *pkt_len, size_t *data_len, size_t *vlan_tci);
/* Bytes an mbuf of the pool holds after its headroom. */
uint16_t up_data_room(struct rte_mempool *pool);
/* The calling thread's lcore id (LCORE_ID_ANY outside EAL threads). */
unsigned up_lcore_id(void);

#endif
