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

/* Like rte_pktmbuf_alloc_bulk, but resets only what a transmit needs, as
 * testpmd's txonly engine does: mbufs come back to the pool through
 * rte_pktmbuf_free, which already leaves next = NULL, nb_segs = 1 and
 * refcnt = 1, and the Tx offload fields are ignored while ol_flags asks
 * for no offload. Everything touched lies in the mbuf's first cache line. */
int up_alloc_bulk(struct rte_mempool *pool, struct rte_mbuf **pkts, unsigned n, uint8_t **data) {
    int rc = rte_mempool_get_bulk(pool, (void **)pkts, n);
    if (rc != 0)
        return rc;
    for (unsigned i = 0; i < n; i++) {
        struct rte_mbuf *m = pkts[i];
        rte_pktmbuf_reset_headroom(m);
        m->ol_flags &= RTE_MBUF_F_EXTERNAL;
        m->packet_type = 0;
        m->vlan_tci = 0;
        data[i] = rte_pktmbuf_mtod(m, uint8_t *);
    }
    return 0;
}

void up_free_bulk(struct rte_mbuf **pkts, unsigned n) { rte_pktmbuf_free_bulk(pkts, n); }

void up_rx_frames(struct rte_mbuf **pkts, uint16_t n, uint8_t **data, uint16_t *len) {
    for (uint16_t i = 0; i < n; i++) {
        data[i] = rte_pktmbuf_mtod(pkts[i], uint8_t *);
        len[i] = pkts[i]->nb_segs == 1 ? pkts[i]->data_len : 0;
    }
}

void up_tx_lengths(struct rte_mbuf **pkts, uint16_t n, const uint16_t *len) {
    for (uint16_t i = 0; i < n; i++) {
        pkts[i]->data_len = len[i];
        pkts[i]->pkt_len = len[i];
    }
}

void up_len_offsets(size_t *pkt_len, size_t *data_len, size_t *vlan_tci) {
    *pkt_len = offsetof(struct rte_mbuf, pkt_len);
    *data_len = offsetof(struct rte_mbuf, data_len);
    *vlan_tci = offsetof(struct rte_mbuf, vlan_tci);
}

uint16_t up_data_room(struct rte_mempool *pool) {
    return rte_pktmbuf_data_room_size(pool) - RTE_PKTMBUF_HEADROOM;
}

unsigned up_lcore_id(void) { return rte_lcore_id(); }
