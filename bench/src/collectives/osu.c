/* OSU-style latency of one MPI collective, the reference side of
 * `uniplane-bench collectives`. Built at run time with mpicc (OpenMPI or
 * MPICH). Usage: osu OP SIZE:ITERS... ; OP is allreduce, bcast, reduce,
 * allgather, alltoall or barrier. int32 elements (sum for reductions);
 * SIZE is bytes per rank (per block for allgather and alltoall). Rank 0
 * prints, per size: SIZE AVG_US P50_US CPU_US, where AVG_US is the mean
 * over ranks of each rank's mean latency, P50_US rank 0's median, CPU_US
 * the CPU time (user + system) of all ranks per operation. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static double cpu_seconds(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc < 3) MPI_Abort(MPI_COMM_WORLD, 2);
    const char *op = argv[1];
    for (int a = 2; a < argc; a++) {
        size_t size = 0;
        int iters = 0;
        if (sscanf(argv[a], "%zu:%d", &size, &iters) != 2 || iters < 1) MPI_Abort(MPI_COMM_WORLD, 2);
        int count = size / 4 > 0 ? (int)(size / 4) : 1;
        int *sbuf = calloc((size_t)count * n, 4), *rbuf = calloc((size_t)count * n, 4);
        double *lat = malloc(sizeof(double) * iters);
        int warmup = iters / 10 + 2;
        double c0 = 0;
        for (int i = -warmup; i < iters; i++) {
            if (i == 0) {
                MPI_Barrier(MPI_COMM_WORLD);
                c0 = cpu_seconds();
            }
            double t0 = MPI_Wtime();
            if (!strcmp(op, "allreduce")) MPI_Allreduce(sbuf, rbuf, count, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
            else if (!strcmp(op, "bcast")) MPI_Bcast(sbuf, count, MPI_INT, 0, MPI_COMM_WORLD);
            else if (!strcmp(op, "reduce")) MPI_Reduce(sbuf, rbuf, count, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
            else if (!strcmp(op, "allgather")) MPI_Allgather(sbuf, count, MPI_INT, rbuf, count, MPI_INT, MPI_COMM_WORLD);
            else if (!strcmp(op, "alltoall")) MPI_Alltoall(sbuf, count, MPI_INT, rbuf, count, MPI_INT, MPI_COMM_WORLD);
            else MPI_Barrier(MPI_COMM_WORLD);
            if (i >= 0) lat[i] = MPI_Wtime() - t0;
        }
        double cpu = (cpu_seconds() - c0) / iters, cpu_all = 0;
        double mean = 0, mean_all = 0;
        for (int i = 0; i < iters; i++) mean += lat[i];
        mean /= iters;
        MPI_Reduce(&mean, &mean_all, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        MPI_Reduce(&cpu, &cpu_all, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            qsort(lat, iters, sizeof(double), cmp);
            printf("%zu %.3f %.3f %.3f\n", size, mean_all / n * 1e6, lat[iters / 2] * 1e6, cpu_all * 1e6);
            fflush(stdout);
        }
        free(sbuf);
        free(rbuf);
        free(lat);
    }
    MPI_Finalize();
    return 0;
}
