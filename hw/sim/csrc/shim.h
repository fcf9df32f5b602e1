// uniplane-hw-sim: a small C ABI over a Verilator model of uniplane_top.
//
// UP_SIM_DEFINE(prefix, Model, N, M) defines extern "C" functions
// prefix_new, prefix_free, prefix_set_in, ... over the generated class
// Model built with N overlay ports and M underlay stacks. Rust (src/ffi.rs)
// declares the same functions. Streams are addressed by kind:
// 0 = overlay ports, 1 = underlay stacks, 2 = the underlay's interface.
#pragma once

#include <cstdint>

#include "verilated.h"

namespace upsim {

template <class I>
inline void set_bit(I& v, unsigned bit, int x) {
    if (x) {
        v = static_cast<I>(v | (static_cast<I>(1) << bit));
    } else {
        v = static_cast<I>(v & ~(static_cast<I>(1) << bit));
    }
}

template <class I>
inline int get_bit(const I& v, unsigned bit) {
    return static_cast<int>((v >> bit) & 1);
}

template <class W>
inline void set_beat(W& w, unsigned idx, const uint32_t* d) {
    for (unsigned i = 0; i < 8; i++) w[idx * 8 + i] = d[i];
}

template <class W>
inline void get_beat(const W& w, unsigned idx, uint32_t* d) {
    for (unsigned i = 0; i < 8; i++) d[i] = w[idx * 8 + i];
}

template <class Model>
struct Sim {
    VerilatedContext ctx;
    Model* top;
    Sim() : top(nullptr) {
        ctx.randReset(0);
        top = new Model{&ctx};
        top->clk = 0;
        top->rst = 1;
        top->eval();
    }
    ~Sim() {
        top->final();
        delete top;
    }
};

}  // namespace upsim

#define UP_SIM_DEFINE(P, Model, NPORTS, NSTACKS)                                             \
    extern "C" {                                                                             \
    void* P##_new() { return new upsim::Sim<Model>(); }                                      \
    void P##_free(void* s) { delete static_cast<upsim::Sim<Model>*>(s); }                    \
    unsigned P##_ports() { return NPORTS; }                                                  \
    unsigned P##_stacks() { return NSTACKS; }                                                \
    void P##_set_rst(void* s, int v) { static_cast<upsim::Sim<Model>*>(s)->top->rst = v; }   \
    void P##_eval(void* s) { static_cast<upsim::Sim<Model>*>(s)->top->eval(); }              \
    void P##_tick(void* s) {                                                                 \
        Model* t = static_cast<upsim::Sim<Model>*>(s)->top;                                  \
        t->clk = 1;                                                                          \
        t->eval();                                                                           \
        t->clk = 0;                                                                          \
        t->eval();                                                                           \
    }                                                                                        \
    void P##_set_in(void* s, int kind, unsigned i, int valid, int first, int last,           \
                    const uint32_t* d) {                                                     \
        Model* t = static_cast<upsim::Sim<Model>*>(s)->top;                                  \
        if (kind == 0) {                                                                     \
            upsim::set_bit(t->s_axis_tvalid, i, valid);                                      \
            upsim::set_bit(t->s_axis_tfirst, i, first);                                      \
            upsim::set_bit(t->s_axis_tlast, i, last);                                        \
            upsim::set_beat(t->s_axis_tdata, i, d);                                          \
        } else if (kind == 1) {                                                              \
            upsim::set_bit(t->stk_s_axis_tvalid, i, valid);                                  \
            upsim::set_bit(t->stk_s_axis_tfirst, i, first);                                  \
            upsim::set_bit(t->stk_s_axis_tlast, i, last);                                    \
            upsim::set_beat(t->stk_s_axis_tdata, i, d);                                      \
        } else {                                                                             \
            t->if_s_axis_tvalid = valid;                                                     \
            t->if_s_axis_tfirst = first;                                                     \
            t->if_s_axis_tlast = last;                                                       \
            upsim::set_beat(t->if_s_axis_tdata, 0, d);                                       \
        }                                                                                    \
    }                                                                                        \
    int P##_in_ready(void* s, int kind, unsigned i) {                                        \
        Model* t = static_cast<upsim::Sim<Model>*>(s)->top;                                  \
        if (kind == 0) return upsim::get_bit(t->s_axis_tready, i);                           \
        if (kind == 1) return upsim::get_bit(t->stk_s_axis_tready, i);                       \
        return t->if_s_axis_tready;                                                          \
    }                                                                                        \
    void P##_set_out_ready(void* s, int kind, unsigned i, int ready) {                       \
        Model* t = static_cast<upsim::Sim<Model>*>(s)->top;                                  \
        if (kind == 0) upsim::set_bit(t->m_axis_tready, i, ready);                           \
        else if (kind == 1) upsim::set_bit(t->stk_m_axis_tready, i, ready);                  \
        else t->if_m_axis_tready = ready;                                                    \
    }                                                                                        \
    int P##_out(void* s, int kind, unsigned i, int* first, int* last, uint32_t* d) {         \
        Model* t = static_cast<upsim::Sim<Model>*>(s)->top;                                  \
        if (kind == 0) {                                                                     \
            *first = upsim::get_bit(t->m_axis_tfirst, i);                                    \
            *last = upsim::get_bit(t->m_axis_tlast, i);                                      \
            upsim::get_beat(t->m_axis_tdata, i, d);                                          \
            return upsim::get_bit(t->m_axis_tvalid, i);                                      \
        }                                                                                    \
        if (kind == 1) {                                                                     \
            *first = upsim::get_bit(t->stk_m_axis_tfirst, i);                                \
            *last = upsim::get_bit(t->stk_m_axis_tlast, i);                                  \
            upsim::get_beat(t->stk_m_axis_tdata, i, d);                                      \
            return upsim::get_bit(t->stk_m_axis_tvalid, i);                                  \
        }                                                                                    \
        *first = t->if_m_axis_tfirst;                                                        \
        *last = t->if_m_axis_tlast;                                                          \
        upsim::get_beat(t->if_m_axis_tdata, 0, d);                                           \
        return t->if_m_axis_tvalid;                                                          \
    }                                                                                        \
    void P##_set_axil(void* s, uint32_t awaddr, int awvalid, uint32_t wdata, int wvalid,     \
                      int bready, uint32_t araddr, int arvalid, int rready) {                \
        Model* t = static_cast<upsim::Sim<Model>*>(s)->top;                                  \
        t->s_axil_awaddr = awaddr;                                                           \
        t->s_axil_awvalid = awvalid;                                                         \
        t->s_axil_wdata = wdata;                                                             \
        t->s_axil_wstrb = 0xf;                                                               \
        t->s_axil_wvalid = wvalid;                                                           \
        t->s_axil_bready = bready;                                                           \
        t->s_axil_araddr = araddr;                                                           \
        t->s_axil_arvalid = arvalid;                                                         \
        t->s_axil_rready = rready;                                                           \
    }                                                                                        \
    void P##_axil_out(void* s, uint32_t* o) {                                                \
        Model* t = static_cast<upsim::Sim<Model>*>(s)->top;                                  \
        o[0] = t->s_axil_awready;                                                            \
        o[1] = t->s_axil_wready;                                                             \
        o[2] = t->s_axil_bvalid;                                                             \
        o[3] = t->s_axil_arready;                                                            \
        o[4] = t->s_axil_rvalid;                                                             \
        o[5] = t->s_axil_rdata;                                                              \
    }                                                                                        \
    }
