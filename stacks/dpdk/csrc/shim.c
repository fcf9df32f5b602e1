/* Burst-wide wrappers of DPDK's static inline hot paths: one call from
 * Rust per burst, never per frame. */
#include <stddef.h>

#include "shim.h"

int up_errno(void) { return rte_errno; }

uint16_t up_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n) {
    return rte_eth_rx_burst(port, queue, pkts, n);
}

uint16_t up_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n) {
    return rte_eth_tx_burst(port, queue, pkts, n);
}

/* Mbufs for transmission, taken from the pool and nothing more: Rust
 * resets each one as it writes its frame (see up_tx_layout), so the
 * mbuf's first cache line is brought in once per frame, not once here
 * and again for the lengths. */
int up_get_bulk(struct rte_mempool *pool, struct rte_mbuf **pkts, unsigned n) {
    return rte_mempool_get_bulk(pool, (void **)pkts, n);
}

void up_free_bulk(struct rte_mbuf **pkts, unsigned n) { rte_pktmbuf_free_bulk(pkts, n); }

void up_rx_frames(struct rte_mbuf **pkts, uint16_t n, uint8_t **data, uint16_t *len) {
    for (uint16_t i = 0; i < n; i++) {
        data[i] = rte_pktmbuf_mtod(pkts[i], uint8_t *);
        len[i] = pkts[i]->nb_segs == 1 ? pkts[i]->data_len : 0;
    }
}

void up_tx_layout(size_t off[7], uint16_t *headroom, uint64_t *keep_flags) {
    off[0] = offsetof(struct rte_mbuf, buf_addr);
    off[1] = offsetof(struct rte_mbuf, data_off);
    off[2] = offsetof(struct rte_mbuf, ol_flags);
    off[3] = offsetof(struct rte_mbuf, packet_type);
    off[4] = offsetof(struct rte_mbuf, pkt_len);
    off[5] = offsetof(struct rte_mbuf, data_len);
    off[6] = offsetof(struct rte_mbuf, vlan_tci);
    *headroom = RTE_PKTMBUF_HEADROOM;
    *keep_flags = RTE_MBUF_F_EXTERNAL;
}

uint16_t up_data_room(struct rte_mempool *pool) {
    return rte_pktmbuf_data_room_size(pool) - RTE_PKTMBUF_HEADROOM;
}

unsigned up_lcore_id(void) { return rte_lcore_id(); }
