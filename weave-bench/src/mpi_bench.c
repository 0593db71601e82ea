/*
 * mpi_bench.c: the Open MPI baseline of `weave-bench` (`cargo xtask bench`).
 *
 * Embedded into weave-bench, written to target/weave-bench/mpi_bench.c and built with `mpicc -O2`;
 * run with `mpirun -np N mpi_bench ARGS`. It measures exactly what src/bin/bench-worker.rs
 * measures, with the same arguments and the same JSON lines on rank 0; keep the two in step:
 *
 *   --op all_reduce|all_gather|reduce_scatter|broadcast|reduce|all_to_all
 *   -b MIN -e MAX -f FACTOR   sizes in bytes (K/M/G suffixes = powers of 1024), min..max
 *                             multiplying by FACTOR
 *   --dtype T                 float double half bfloat16 int8 uint8 int32 uint32 int64 uint64
 *   --redop sum|prod|min|max|avg
 *   --iters N --warmup N --rounds K --turns SOCKET --turn-timeout SECS --check --inplace
 *
 * Method: per size, `rounds` batches of `warmup` untimed calls, then `iters` calls each timed
 * on its own with CLOCK_MONOTONIC (no barrier between calls); then MPI_Allreduce(MAX) of the
 * per-call times of all batches (untimed) and the median of the maxima. With --turns, each
 * rank connects to the driver's Unix socket, says `mpi RANK\n`, blocks before every batch
 * until it reads `g` and writes `d` after it (after the last batch of a size: once rank 0's
 * line is out), so this job and weave's take turns (see bench-worker.rs). With --check, before every call (untimed) the input
 * is restored (in place) or the output poisoned (out of place), and after it (untimed) every
 * result element is compared with the exact expected value; `wrong` sums wrong elements over
 * ranks and calls. Inputs are the same small integers as the weave worker's. `shared_cpu`: two
 * ranks were on one CPU (sched_getcpu) at the end of the size. `create_s`: the slowest rank's
 * MPI_Init, in seconds (CLOCK_MONOTONIC around it; weave's worker times its communicator's
 * creation). `nodes`: how many distinct host names (gethostname) the ranks ran under, so the
 * caller can check that Open MPI placed them on the nodes it was asked to.
 *
 * Mapping to MPI: MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block, MPI_Bcast,
 * MPI_Reduce, MPI_Alltoall; in place through MPI_IN_PLACE (reduce_scatter's in-place result is
 * at the start of the buffer, MPI's convention). Out-of-place broadcast: MPI_Bcast from the
 * root's send buffer into the others' receive buffers, then a memcpy on the root (timed), so
 * every rank ends with the data in its receive buffer as with weave. avg: MPI_SUM, then each
 * rank divides its result by N (timed; integers truncate). half and bfloat16: MPI_UINT16_T
 * with user-defined operators that compute in float and round to nearest even.
 */
#define _GNU_SOURCE /* sched_getcpu */
#include <mpi.h>

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

enum coll { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, REDUCE, ALL_TO_ALL };
static const char *COLL_NAMES[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"};

enum dtype { F64, F32, F16, BF16, I64, I32, U64, U32, I8, U8 };
static const char *DTYPE_NAMES[] = {"double", "float", "half", "bfloat16", "int64",
                                    "int32",  "uint64", "uint32", "int8",   "uint8"};
static const char *DTYPE_RUST_NAMES[] = {"f64", "f32", "f16", "bf16", "i64", "i32", "u64", "u32", "i8", "u8"};
static const size_t DTYPE_SIZES[] = {8, 4, 2, 2, 8, 4, 8, 4, 1, 1};

enum redop { SUM, PROD, MIN, MAX, AVG };
static const char *REDOP_NAMES[] = {"sum", "prod", "min", "max", "avg"};

#define ROOT 0
#define SENTINEL (-77.0)

struct options {
    int coll;
    size_t min_bytes, max_bytes, factor;
    int dtype, redop;
    long iters, warmup, rounds, turn_timeout;
    int check, inplace;
    const char *turns;
};

static int rank, nranks, nodes;

/* ---- turns (the driver's socket) ---------------------------------------------------------- */

static int turn_fd = -1;

static void turn_fail(const char *what) {
    fprintf(stderr, "mpi_bench rank %d: turn socket: %s\n", rank, what);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static void turn_connect(const struct options *o) {
    if (!o->turns) return;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(o->turns) >= sizeof addr.sun_path) turn_fail("path too long");
    strcpy(addr.sun_path, o->turns);
    turn_fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (turn_fd < 0 || connect(turn_fd, (struct sockaddr *)&addr, sizeof addr) != 0) turn_fail("connect failed");
    char hello[32];
    int len = snprintf(hello, sizeof hello, "mpi %d\n", rank);
    if (write(turn_fd, hello, (size_t)len) != len) turn_fail("hello failed");
}

/* Blocks (without spinning) until the driver gives this job the next turn. */
static void turn_wait(const struct options *o) {
    if (turn_fd < 0) return;
    struct pollfd p = {.fd = turn_fd, .events = POLLIN};
    /* poll fails with EINTR after the process was stopped and continued: wait on. */
    int ready;
    while ((ready = poll(&p, 1, (int)(o->turn_timeout * 1000))) < 0 && errno == EINTR) {
    }
    if (ready != 1) turn_fail("no turn within the timeout");
    char c;
    ssize_t got;
    while ((got = read(turn_fd, &c, 1)) < 0 && errno == EINTR) {
    }
    if (got != 1 || c != 'g') turn_fail("closed, or an unexpected byte");
}

static void turn_done(void) {
    if (turn_fd >= 0 && write(turn_fd, "d", 1) != 1) turn_fail("ending a turn failed");
}


/* ---- half and bfloat16 ------------------------------------------------------------------ */

/* The float whose IEEE-754 bits are `f`. */
static float float_from_bits(uint32_t f) {
    float r;
    memcpy(&r, &f, 4);
    return r;
}

/* The IEEE-754 bits of `x`. */
static uint32_t float_bits(float x) {
    uint32_t f;
    memcpy(&f, &x, 4);
    return f;
}

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, f;
    if (exp == 0) {
        if (mant == 0) {
            f = sign;
        } else {
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) {
                mant <<= 1;
                exp--;
            }
            f = sign | (exp << 23) | ((mant & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        f = sign | 0x7f800000u | (mant << 13);
    } else {
        f = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    return float_from_bits(f);
}

static uint16_t float_to_half(float x) {
    uint32_t f = float_bits(x);
    uint32_t sign = (f >> 16) & 0x8000, fexp = (f >> 23) & 0xff, mant = f & 0x7fffff;
    int32_t exp = (int32_t)fexp - 127 + 15;
    if (fexp == 0xff) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        mant |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp), h = mant >> shift, rem = mant & ((1u << shift) - 1),
                 halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)exp << 10) | (mant >> 13), rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* a carry into the exponent is right */
    return (uint16_t)(sign | h);
}

static float bf16_to_float(uint16_t b) {
    return float_from_bits((uint32_t)b << 16);
}

static uint16_t float_to_bf16(float x) {
    uint32_t f = float_bits(x);
    if ((f & 0x7fffffff) > 0x7f800000) return (uint16_t)((f >> 16) | 0x40);
    f += 0x7fff + ((f >> 16) & 1);
    return (uint16_t)(f >> 16);
}

#define USER_OP(name, to, from, expr)                                                 \
    static void name(void *in, void *inout, int *len, MPI_Datatype *type) {          \
        (void)type;                                                                   \
        const uint16_t *x = in;                                                       \
        uint16_t *y = inout;                                                          \
        for (int i = 0; i < *len; i++) {                                              \
            float a = to(x[i]), b = to(y[i]);                                         \
            y[i] = from(expr);                                                        \
        }                                                                             \
    }
USER_OP(half_sum, half_to_float, float_to_half, a + b)
USER_OP(half_prod, half_to_float, float_to_half, a * b)
USER_OP(half_min, half_to_float, float_to_half, b < a ? b : a)
USER_OP(half_max, half_to_float, float_to_half, b > a ? b : a)
USER_OP(bf16_sum, bf16_to_float, float_to_bf16, a + b)
USER_OP(bf16_prod, bf16_to_float, float_to_bf16, a * b)
USER_OP(bf16_min, bf16_to_float, float_to_bf16, b < a ? b : a)
USER_OP(bf16_max, bf16_to_float, float_to_bf16, b > a ? b : a)

/* ---- elements as numbers ------------------------------------------------------------------ */

/* Truncates `v` and wraps it modulo 2^64, as Rust's `v as i128 as u64` does. */
static uint64_t wrap64(double v) {
    const double two63 = 9223372036854775808.0, two64 = 18446744073709551616.0;
    v = trunc(v);
    if (v != v) return 0;
    if (v >= -two63 && v < two63) return (uint64_t)(int64_t)v;
    double m = fmod(v, two64); /* exact; |m| >= 2^63 or m is small again */
    if (m >= -two63 && m < two63) return (uint64_t)(int64_t)m;
    if (m < 0) m += two64; /* exact: both are multiples of m's ulp */
    return (uint64_t)m;
}

/* Element `i` of `p` as a double. */
static double get(int dt, const void *p, size_t i) {
    switch (dt) {
    case F64: return ((const double *)p)[i];
    case F32: return ((const float *)p)[i];
    case F16: return half_to_float(((const uint16_t *)p)[i]);
    case BF16: return bf16_to_float(((const uint16_t *)p)[i]);
    case I64: return (double)((const int64_t *)p)[i];
    case I32: return ((const int32_t *)p)[i];
    case U64: return (double)((const uint64_t *)p)[i];
    case U32: return ((const uint32_t *)p)[i];
    case I8: return ((const int8_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
    }
}

/* Stores `v` into element `i` of `p`: floats round, integers truncate and wrap. */
static void set(int dt, void *p, size_t i, double v) {
    switch (dt) {
    case F64: ((double *)p)[i] = v; break;
    case F32: ((float *)p)[i] = (float)v; break;
    case F16: ((uint16_t *)p)[i] = float_to_half((float)v); break;
    case BF16: ((uint16_t *)p)[i] = float_to_bf16((float)v); break;
    case I64: ((int64_t *)p)[i] = (int64_t)wrap64(v); break;
    case I32: ((int32_t *)p)[i] = (int32_t)(uint32_t)wrap64(v); break;
    case U64: ((uint64_t *)p)[i] = wrap64(v); break;
    case U32: ((uint32_t *)p)[i] = (uint32_t)wrap64(v); break;
    case I8: ((int8_t *)p)[i] = (int8_t)(uint8_t)wrap64(v); break;
    default: ((uint8_t *)p)[i] = (uint8_t)wrap64(v); break;
    }
}

static int is_float(int dt) { return dt == F64 || dt == F32 || dt == F16 || dt == BF16; }
static int is_unsigned(int dt) { return dt == U64 || dt == U32 || dt == U8; }
static int reduces(int coll) { return coll == ALL_REDUCE || coll == REDUCE_SCATTER || coll == REDUCE; }

/* Input element `i` of rank `r` (the weave worker's `input_value`). */
static double value(const struct options *o, int r, size_t i) {
    uint32_t h = ((uint32_t)i * 2654435761u + (uint32_t)r * 40503u) >> 28;
    if (reduces(o->coll) && o->redop == PROD) {
        if ((h & 3) == 1) return 2.0;
        if ((h & 3) == 2 && !is_unsigned(o->dtype)) return -1.0;
        return 1.0;
    }
    return is_unsigned(o->dtype) ? (double)h : (double)h - 4.0;
}

/* The reduction of input element `i` over every rank, stored into element `j` of `out`. */
static void set_reduced(const struct options *o, void *out, size_t j, size_t i) {
    double acc = o->redop == PROD ? 1.0 : o->redop == MIN ? INFINITY : o->redop == MAX ? -INFINITY : 0.0;
    for (int r = 0; r < nranks; r++) {
        double v = value(o, r, i);
        switch (o->redop) {
        case PROD: acc *= v; break;
        case MIN: acc = v < acc ? v : acc; break;
        case MAX: acc = v > acc ? v : acc; break;
        default: acc += v; break;
        }
    }
    if (o->redop != AVG) {
        set(o->dtype, out, j, acc);
    } else if (is_float(o->dtype)) {
        set(o->dtype, out, j, acc / nranks);
    } else {
        set(o->dtype, out, j, acc); /* wrap first, then divide with truncation */
        set(o->dtype, out, j, trunc(get(o->dtype, out, j) / nranks));
    }
}

/* ---- the run ------------------------------------------------------------------------------ */

static MPI_Datatype mpi_type(int dt) {
    switch (dt) {
    case F64: return MPI_DOUBLE;
    case F32: return MPI_FLOAT;
    case I64: return MPI_INT64_T;
    case I32: return MPI_INT32_T;
    case U64: return MPI_UINT64_T;
    case U32: return MPI_UINT32_T;
    case I8: return MPI_INT8_T;
    case U8: return MPI_UINT8_T;
    default: return MPI_UINT16_T; /* half, bfloat16 */
    }
}

static MPI_Op mpi_op(int dt, int redop) {
    static MPI_Op user[2][4];
    static int made = 0;
    if (!made) {
        MPI_User_function *fns[2][4] = {{half_sum, half_prod, half_min, half_max},
                                        {bf16_sum, bf16_prod, bf16_min, bf16_max}};
        for (int t = 0; t < 2; t++)
            for (int k = 0; k < 4; k++) MPI_Op_create(fns[t][k], 1, &user[t][k]);
        made = 1;
    }
    int k = redop == AVG ? SUM : redop;
    if (dt == F16) return user[0][k];
    if (dt == BF16) return user[1][k];
    MPI_Op ops[4] = {MPI_SUM, MPI_PROD, MPI_MIN, MPI_MAX};
    return ops[k];
}

/* avg: divides `len` result elements by the number of ranks (integers truncate). */
#define DIVIDE(ctype)                                                       \
    do {                                                                    \
        ctype *x = p;                                                       \
        for (size_t i = 0; i < len; i++) x[i] = (ctype)(x[i] / (ctype)nranks); \
    } while (0)
static void divide(int dt, void *p, size_t len) {
    switch (dt) {
    case F64: DIVIDE(double); break;
    case F32: DIVIDE(float); break;
    case I64: DIVIDE(int64_t); break;
    case I32: DIVIDE(int32_t); break;
    case U64: DIVIDE(uint64_t); break;
    case U32: DIVIDE(uint32_t); break;
    case I8: DIVIDE(int8_t); break;
    case U8: DIVIDE(uint8_t); break;
    case F16: {
        uint16_t *x = p;
        for (size_t i = 0; i < len; i++) x[i] = float_to_half(half_to_float(x[i]) / (float)nranks);
        break;
    }
    default: {
        uint16_t *x = p;
        for (size_t i = 0; i < len; i++) x[i] = float_to_bf16(bf16_to_float(x[i]) / (float)nranks);
        break;
    }
    }
}

static void *xalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "mpi_bench rank %d: cannot allocate %zu bytes\n", rank, bytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return p;
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y ? 1 : 0;
}

static double median(double *v, long n) {
    if (n == 0) return 0.0;
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

static double tolerance(int dt) {
    switch (dt) {
    case F64: return 1e-12;
    case F32: return 1e-6;
    case F16: return 1e-3;
    case BF16: return 8e-3;
    default: return 0.0;
    }
}

static uint64_t count_wrong(const struct options *o, const void *got, const void *want, size_t len) {
    size_t e = DTYPE_SIZES[o->dtype];
    int avg_float = o->redop == AVG && reduces(o->coll) && is_float(o->dtype);
    if (!avg_float && memcmp(got, want, len * e) == 0) return 0;
    double tol = tolerance(o->dtype);
    uint64_t wrong = 0;
    for (size_t i = 0; i < len; i++) {
        double g = get(o->dtype, got, i), w = get(o->dtype, want, i);
        if (avg_float ? fabs(g - w) > tol * (fabs(w) > 1.0 ? fabs(w) : 1.0) : g != w) wrong++;
    }
    return wrong;
}

/* One call of the collective (the timed region). */
static void call(const struct options *o, void *a, void *b, size_t count) {
    MPI_Datatype t = mpi_type(o->dtype);
    MPI_Comm w = MPI_COMM_WORLD;
    int c = (int)count, root = rank == ROOT;
    MPI_Op op = reduces(o->coll) ? mpi_op(o->dtype, o->redop) : MPI_OP_NULL;
    switch (o->coll) {
    case ALL_REDUCE:
        if (o->inplace) MPI_Allreduce(MPI_IN_PLACE, a, c, t, op, w);
        else MPI_Allreduce(a, b, c, t, op, w);
        break;
    case ALL_GATHER:
        if (o->inplace) MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, a, c, t, w);
        else MPI_Allgather(a, c, t, b, c, t, w);
        break;
    case REDUCE_SCATTER:
        if (o->inplace) MPI_Reduce_scatter_block(MPI_IN_PLACE, a, c, t, op, w);
        else MPI_Reduce_scatter_block(a, b, c, t, op, w);
        break;
    case BROADCAST:
        if (o->inplace) {
            MPI_Bcast(a, c, t, ROOT, w);
        } else {
            MPI_Bcast(root ? a : b, c, t, ROOT, w);
            if (root && count) memcpy(b, a, count * DTYPE_SIZES[o->dtype]);
        }
        break;
    case REDUCE:
        if (o->inplace) MPI_Reduce(root ? MPI_IN_PLACE : a, root ? a : NULL, c, t, op, ROOT, w);
        else MPI_Reduce(a, root ? b : NULL, c, t, op, ROOT, w);
        break;
    default:
        if (o->inplace) MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, a, c, t, w);
        else MPI_Alltoall(a, c, t, b, c, t, w);
        break;
    }
    if (o->redop == AVG && reduces(o->coll) && (o->coll != REDUCE || root)) {
        divide(o->dtype, o->inplace ? a : b, count);
    }
}

static int json_line(const struct options *o, size_t bytes, size_t count, double time_us, int have_wrong,
                     uint64_t wrong, int shared_cpu, double create_s) {
    double n = nranks, factor = 1.0;
    if (o->coll == ALL_REDUCE) factor = 2.0 * (n - 1.0) / n;
    else if (o->coll == ALL_GATHER || o->coll == REDUCE_SCATTER || o->coll == ALL_TO_ALL) factor = (n - 1.0) / n;
    double algbw = time_us > 0 ? (double)bytes / 1e9 / (time_us / 1e6) : 0.0;
    char w[32];
    if (have_wrong) snprintf(w, sizeof w, "%llu", (unsigned long long)wrong);
    else snprintf(w, sizeof w, "null");
    return printf("{\"op\":\"%s\",\"bytes\":%zu,\"count\":%zu,\"dtype\":\"%s\",\"redop\":\"%s\",\"inplace\":%s,"
                  "\"ranks\":%d,\"time_us\":%.9g,\"algbw\":%.9g,\"busbw\":%.9g,\"wrong\":%s,\"algorithm\":\"mpi\","
                  "\"shared_cpu\":%s,\"create_s\":%.9g,\"nodes\":%d}\n",
                  COLL_NAMES[o->coll], bytes, count, DTYPE_NAMES[o->dtype],
                  reduces(o->coll) ? REDOP_NAMES[o->redop] : "none", o->inplace ? "true" : "false", nranks,
                  time_us, algbw, algbw * factor, w, shared_cpu ? "true" : "false", create_s, nodes);
}

static void run_size(const struct options *o, size_t size, double create_s) {
    size_t e = DTYPE_SIZES[o->dtype], n = (size_t)nranks, count = size / e;
    int block = !(o->coll == ALL_REDUCE || o->coll == BROADCAST || o->coll == REDUCE);
    if (block) count = (count / n) & ~(16 / e - 1);
    size_t nc = n * count, root = rank == ROOT;
    if (nc > INT_MAX) {
        if (rank == 0) fprintf(stderr, "mpi_bench: %zu elements exceed MPI's int count\n", nc);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* Buffer lengths, as the weave worker's `lengths`. */
    size_t len_a, len_b;
    if (o->inplace) {
        len_a = block ? nc : count;
        len_b = 0;
    } else {
        switch (o->coll) {
        case ALL_GATHER: len_a = count, len_b = nc; break;
        case REDUCE_SCATTER: len_a = nc, len_b = count; break;
        case BROADCAST: len_a = root ? count : 0, len_b = count; break;
        case REDUCE: len_a = count, len_b = root ? count : 0; break;
        case ALL_TO_ALL: len_a = nc, len_b = nc; break;
        default: len_a = count, len_b = count; break;
        }
    }
    char *init = xalloc(len_a * e), *a = xalloc(len_a * e), *b = xalloc(len_b * e), *sentinel = xalloc(e);
    set(o->dtype, sentinel, 0, SENTINEL);
    for (size_t i = 0; i < len_a; i++) {
        if (o->coll == ALL_GATHER && o->inplace) {
            if (i / count != (size_t)rank) memcpy(init + i * e, sentinel, e);
            else set(o->dtype, init, i, value(o, rank, i - (size_t)rank * count));
        } else if (o->coll == BROADCAST) {
            if (rank != ROOT) memcpy(init + i * e, sentinel, e);
            else set(o->dtype, init, i, value(o, ROOT, i));
        } else {
            set(o->dtype, init, i, value(o, rank, i));
        }
    }
    memcpy(a, init, len_a * e);
    for (size_t i = 0; i < len_b; i++) memcpy(b + i * e, sentinel, e);

    /* Expected result (its length; reduce has none off the root). */
    size_t len_x = 0;
    char *want = NULL;
    if (o->check && !(o->coll == REDUCE && rank != ROOT)) {
        len_x = (o->coll == ALL_GATHER || o->coll == ALL_TO_ALL) ? nc : count;
        want = xalloc(len_x * e);
        for (size_t j = 0; j < len_x; j++) {
            switch (o->coll) {
            case ALL_REDUCE:
            case REDUCE: set_reduced(o, want, j, j); break;
            case REDUCE_SCATTER: set_reduced(o, want, j, (size_t)rank * count + j); break;
            case BROADCAST: set(o->dtype, want, j, value(o, ROOT, j)); break;
            case ALL_GATHER: set(o->dtype, want, j, value(o, (int)(j / count), j % count)); break;
            default: set(o->dtype, want, j, value(o, (int)(j / count), (size_t)rank * count + j % count)); break;
            }
        }
    }

    long timed = o->iters * o->rounds;
    double *times = xalloc(sizeof(double) * (size_t)timed), *max_times = xalloc(sizeof(double) * (size_t)timed);
    uint64_t wrong = 0;
    for (long round = 0; round < o->rounds; round++) {
        if (round > 0) {
            /* The other job runs its batch of this size between two of ours. */
            turn_done();
            turn_wait(o);
        }
        for (long it = 0; it < o->warmup + o->iters; it++) {
            if (o->check) {
                if (o->inplace) memcpy(a, init, len_a * e);
                else
                    for (size_t i = 0; i < len_b; i++) memcpy(b + i * e, sentinel, e);
            }
            double t0 = now_us();
            call(o, a, b, count);
            double us = now_us() - t0;
            if (it >= o->warmup) times[round * o->iters + it - o->warmup] = us;
            if (want) wrong += count_wrong(o, o->inplace ? a : b, want, len_x);
        }
    }
    MPI_Allreduce(times, max_times, (int)timed, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    uint64_t total = 0;
    if (o->check) MPI_Allreduce(&wrong, &total, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    /* Where the ranks ran at the end (as the weave worker reports it). */
    int cpu = sched_getcpu(), *cpus = xalloc(sizeof(int) * n), shared_cpu = 0;
    MPI_Allgather(&cpu, 1, MPI_INT, cpus, 1, MPI_INT, MPI_COMM_WORLD);
    for (size_t p = 0; p < n; p++)
        for (size_t q = p + 1; q < n; q++) shared_cpu |= cpus[p] >= 0 && cpus[p] == cpus[q];
    free(cpus);
    size_t bytes = (block ? nc : count) * e;
    if (rank == 0) {
        json_line(o, bytes, count, median(max_times, timed), o->check, total, shared_cpu, create_s);
        fflush(stdout);
    }
    free(init), free(a), free(b), free(sentinel), free(want), free(times), free(max_times);
}

/* ---- command line ------------------------------------------------------------------------- */

static int parse_size(const char *s, size_t *out) {
    char buf[64];
    size_t len = strlen(s);
    if (len == 0 || len >= sizeof buf) return 0;
    for (size_t i = 0; i <= len; i++) buf[i] = (char)(s[i] >= 'A' && s[i] <= 'Z' ? s[i] - 'A' + 'a' : s[i]);
    if (len >= 2 && strcmp(buf + len - 2, "ib") == 0) buf[len -= 2] = 0;
    else if (len >= 1 && buf[len - 1] == 'b') buf[len -= 1] = 0;
    unsigned shift = 0;
    if (len > 0 && (buf[len - 1] == 'k' || buf[len - 1] == 'm' || buf[len - 1] == 'g')) {
        shift = buf[len - 1] == 'k' ? 10 : buf[len - 1] == 'm' ? 20 : 30;
        buf[--len] = 0;
    }
    if (len == 0 || len > 19) return 0;
    unsigned long long v = 0;
    for (size_t i = 0; i < len; i++) {
        if (buf[i] < '0' || buf[i] > '9') return 0;
        v = v * 10 + (unsigned long long)(buf[i] - '0');
    }
    if (v > (SIZE_MAX >> shift)) return 0;
    *out = (size_t)v << shift;
    return 1;
}

static int parse_count(const char *s, long min, long *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == 0 || *end != 0 || v < min) return 0;
    *out = v;
    return 1;
}

static int lookup(const char *s, const char **names, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

/* Returns NULL on success, or the error. */
static const char *parse_args(int argc, char **argv, struct options *o) {
    static char err[256];
    *o = (struct options){ALL_REDUCE, 8, 64 << 20, 2, F32, SUM, 20, 5, 1, 600, 0, 0, NULL};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (strcmp(f, "--check") == 0) {
            o->check = 1;
            continue;
        }
        if (strcmp(f, "--inplace") == 0) {
            o->inplace = 1;
            continue;
        }
        if (i + 1 >= argc) {
            snprintf(err, sizeof err, "unexpected argument or missing value: %s", f);
            return err;
        }
        const char *v = argv[++i];
        int ok = 1;
        long l;
        if (strcmp(f, "--op") == 0) {
            ok = (o->coll = lookup(v, COLL_NAMES, 6)) >= 0;
        } else if (strcmp(f, "-b") == 0) {
            ok = parse_size(v, &o->min_bytes);
        } else if (strcmp(f, "-e") == 0) {
            ok = parse_size(v, &o->max_bytes);
        } else if (strcmp(f, "-f") == 0) {
            ok = parse_count(v, 2, &l);
            o->factor = (size_t)l;
        } else if (strcmp(f, "--dtype") == 0) {
            o->dtype = lookup(v, DTYPE_NAMES, 10);
            if (o->dtype < 0) o->dtype = lookup(v, DTYPE_RUST_NAMES, 10);
            ok = o->dtype >= 0;
        } else if (strcmp(f, "--redop") == 0) {
            ok = (o->redop = lookup(v, REDOP_NAMES, 5)) >= 0;
        } else if (strcmp(f, "--iters") == 0) {
            ok = parse_count(v, 1, &o->iters) && o->iters <= INT_MAX;
        } else if (strcmp(f, "--warmup") == 0) {
            ok = parse_count(v, 0, &o->warmup);
        } else if (strcmp(f, "--rounds") == 0) {
            ok = parse_count(v, 1, &o->rounds);
        } else if (strcmp(f, "--turns") == 0) {
            o->turns = v;
        } else if (strcmp(f, "--turn-timeout") == 0) {
            ok = parse_count(v, 1, &o->turn_timeout) && o->turn_timeout <= INT_MAX / 1000;
        } else {
            snprintf(err, sizeof err, "unexpected argument %s", f);
            return err;
        }
        if (!ok) {
            snprintf(err, sizeof err, "bad value for %s: %s", f, v);
            return err;
        }
    }
    if (o->min_bytes == 0) return "-b must be at least 1 byte";
    if (o->min_bytes > o->max_bytes) return "-b is larger than -e";
    return NULL;
}

/* How many distinct host names the ranks run under (each simulated node has its own). */
static int count_hosts(void) {
    enum { NAME = 256 };
    char mine[NAME] = {0};
    if (gethostname(mine, NAME - 1) != 0) snprintf(mine, NAME, "?");
    char *all = xalloc((size_t)nranks * NAME);
    MPI_Allgather(mine, NAME, MPI_CHAR, all, NAME, MPI_CHAR, MPI_COMM_WORLD);
    int distinct = 0;
    for (int r = 0; r < nranks; r++) {
        int seen = 0;
        for (int q = 0; q < r && !seen; q++) seen = strncmp(all + (size_t)r * NAME, all + (size_t)q * NAME, NAME) == 0;
        distinct += !seen;
    }
    free(all);
    return distinct;
}

int main(int argc, char **argv) {
    double init_start = now_us();
    MPI_Init(&argc, &argv);
    double create_s = (now_us() - init_start) / 1e6;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    struct options o;
    const char *err = parse_args(argc, argv, &o);
    if (err) {
        if (rank == 0) fprintf(stderr, "mpi_bench: %s\n", err);
        MPI_Finalize();
        return 2;
    }
    if (o.iters > INT_MAX / o.rounds) {
        if (rank == 0) fprintf(stderr, "mpi_bench: --iters x --rounds exceeds MPI's int count\n");
        MPI_Finalize();
        return 2;
    }
    MPI_Allreduce(MPI_IN_PLACE, &create_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    nodes = count_hosts();
    turn_connect(&o);
    for (size_t size = o.min_bytes; size <= o.max_bytes;) {
        turn_wait(&o);
        run_size(&o, size, create_s);
        turn_done();
        if (size > SIZE_MAX / o.factor) break;
        size *= o.factor;
    }
    MPI_Finalize();
    return 0;
}
