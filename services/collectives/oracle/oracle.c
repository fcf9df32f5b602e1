/* The correctness reference: runs every collective on every datatype and
 * reduction with MPI, on inputs given by a formula of (seed, rank, index),
 * and writes each rank's results to DIR/rank<R>.txt, one line per case:
 *
 *     <collective> <datatype> <op or -> <rank> <result bytes in hex>
 *
 * The Rust test (tests/oracle.rs) computes the same cases with
 * uniplane-collectives and compares line for line. Built with mpicc,
 * run as: mpirun --mca op ^avx -n N oracle DIR SEED
 * (OpenMPI 4.1's AVX reductions saturate 8/16-bit sums; the unsigned
 * types are MPI_UINT*_T because min/max on MPI_UNSIGNED_LONG compare as
 * signed there.) */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COUNT 7 /* bcast, reduce, allreduce */
#define BLOCK 3 /* reduce-scatter, allgather, gather, scatter */
#define A2A 2   /* alltoall block */

static uint64_t seed_g;

/* Must match `value` in tests/oracle.rs. */
static uint64_t value(int rank, int i) {
    uint64_t x = ((uint64_t)rank + 1) * 0x9E3779B97F4A7C15ull;
    x ^= ((uint64_t)i + 1) * 0xBF58476D1CE4E5B9ull;
    x ^= seed_g * 0x94D049BB133111EBull;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    return x;
}

/* Small integers for floats, so that every order of summing is exact. */
static double fvalue(int rank, int i) { return (double)((int)(value(rank, i) % 17) - 8); }

struct dtype {
    const char *name;
    MPI_Datatype mpi;
    int size;
    int is_float;
};

static const struct dtype TYPES[] = {
    {"i8", MPI_INT8_T, 1, 0},   {"i16", MPI_INT16_T, 2, 0},   {"i32", MPI_INT32_T, 4, 0},
    {"i64", MPI_INT64_T, 8, 0}, {"u8", MPI_UINT8_T, 1, 0},    {"u16", MPI_UINT16_T, 2, 0},
    {"u32", MPI_UINT32_T, 4, 0}, {"u64", MPI_UINT64_T, 8, 0}, {"f32", MPI_FLOAT, 4, 1},
    {"f64", MPI_DOUBLE, 8, 1},
};

struct op {
    const char *name;
    MPI_Op mpi;
};

static const struct op OPS[] = {{"sum", MPI_SUM}, {"prod", MPI_PROD}, {"min", MPI_MIN}, {"max", MPI_MAX}};

/* Element i of rank's input as datatype t, written little-endian at p. */
static void fill(const struct dtype *t, int rank, int n, unsigned char *p) {
    for (int i = 0; i < n; i++) {
        unsigned char *e = p + (size_t)i * t->size;
        if (t->is_float && t->size == 4) {
            float f = (float)fvalue(rank, i);
            memcpy(e, &f, 4);
        } else if (t->is_float) {
            double d = fvalue(rank, i);
            memcpy(e, &d, 8);
        } else {
            uint64_t v = value(rank, i);
            memcpy(e, &v, t->size); /* the low bytes: x86 is little-endian */
        }
    }
}

static FILE *out;
static int rank_g;

static void emit(const char *coll, const struct dtype *t, const char *op, const unsigned char *p,
                 int n) {
    fprintf(out, "%s %s %s %d ", coll, t->name, op, rank_g);
    for (int i = 0; i < n * t->size; i++) fprintf(out, "%02x", p[i]);
    fprintf(out, "\n");
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_g);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc != 3) {
        if (rank_g == 0) fprintf(stderr, "usage: oracle DIR SEED\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    seed_g = strtoull(argv[2], NULL, 10);
    char path[4096];
    snprintf(path, sizeof path, "%s/rank%d.txt", argv[1], rank_g);
    out = fopen(path, "w");
    if (!out) {
        perror(path);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int root = n - 1;
    unsigned char *in = malloc((size_t)8 * COUNT * n * 4);
    unsigned char *res = malloc((size_t)8 * COUNT * n * 4);
    for (size_t ti = 0; ti < sizeof TYPES / sizeof TYPES[0]; ti++) {
        const struct dtype *t = &TYPES[ti];
        /* bcast from root */
        fill(t, rank_g == root ? root : rank_g, COUNT, res);
        if (rank_g != root) memset(res, 0, (size_t)COUNT * t->size);
        MPI_Bcast(res, COUNT, t->mpi, root, MPI_COMM_WORLD);
        emit("bcast", t, "-", res, COUNT);
        for (size_t oi = 0; oi < sizeof OPS / sizeof OPS[0]; oi++) {
            const struct op *o = &OPS[oi];
            fill(t, rank_g, COUNT, in);
            MPI_Reduce(in, res, COUNT, t->mpi, o->mpi, root, MPI_COMM_WORLD);
            if (rank_g == root) emit("reduce", t, o->name, res, COUNT);
            MPI_Allreduce(in, res, COUNT, t->mpi, o->mpi, MPI_COMM_WORLD);
            emit("allreduce", t, o->name, res, COUNT);
            fill(t, rank_g, BLOCK * n, in);
            MPI_Reduce_scatter_block(in, res, BLOCK, t->mpi, o->mpi, MPI_COMM_WORLD);
            emit("reduce_scatter", t, o->name, res, BLOCK);
        }
        fill(t, rank_g, BLOCK, in);
        MPI_Allgather(in, BLOCK, t->mpi, res, BLOCK, t->mpi, MPI_COMM_WORLD);
        emit("allgather", t, "-", res, BLOCK * n);
        MPI_Gather(in, BLOCK, t->mpi, res, BLOCK, t->mpi, root, MPI_COMM_WORLD);
        if (rank_g == root) emit("gather", t, "-", res, BLOCK * n);
        fill(t, rank_g, BLOCK * n, in);
        MPI_Scatter(in, BLOCK, t->mpi, res, BLOCK, t->mpi, root, MPI_COMM_WORLD);
        emit("scatter", t, "-", res, BLOCK);
        fill(t, rank_g, A2A * n, in);
        MPI_Alltoall(in, A2A, t->mpi, res, A2A, t->mpi, MPI_COMM_WORLD);
        emit("alltoall", t, "-", res, A2A * n);
    }
    fclose(out);
    free(in);
    free(res);
    MPI_Finalize();
    return 0;
}
