/* The members of a Pulsar batch, decoded in bulk (see ledger/batch_codec.py, which documents the
 * layout; ledger/batch_decoder.py and ledger/batch_encoder.py wrap these functions;
 * ledger/batch_walk.py's pure-Python walker is the executable specification: the two must
 * accept the same batches, refuse the same ones with the same message, and produce the same
 * buffers).
 *
 * An uncompressed batch payload is ``count`` times:
 *
 *     u32 big-endian metadata_size | SingleMessageMetadata (metadata_size bytes) | payload_size bytes
 *
 * check(payload, count, max_members, first_sequence_id) -> int
 *     Validates a batch and returns the sum of its members' record sizes.
 * decode(ledger_id, batches, max_members) -> tuple
 *     Validates batches (each a tuple of batch_codec.Batch's fields) and returns the rows of
 *     their members as flat Arrow buffers (bytes objects; None for a validity bitmap without
 *     nulls), in the order of batch_codec.Columns.
 *
 * Both raise ValueError(reason) for a malformed batch, never read outside a payload, and make
 * no Python object per member.
 *
 * encode(entries, batch_size) -> bytes
 *     The way back: stored members (ledger.entry.Entry tuples) as such a payload again, slot i
 *     the member whose batch index is i, or an empty slot (batch_encoder.encode_batch_payload;
 *     batch_encoder._encode is its specification, the bytes api.pulsar.messages wrote before).
 *     An item of another type than Entry declares is a TypeError.
 *
 * encode_rows(rows, key, value, properties, names, texts, event_time, ordering_key, sequence_id,
 *             starts, counts) -> (payloads, sizes)
 *     The same bytes straight from the Arrow buffers of a sealed ledger's rows (a table slice of
 *     `rows` rows; each column a tuple (length, offset, validity, offsets, data) or None, see
 *     batch_encoder.encode_row_batches), with no Python object per member: batch k is rows
 *     starts[k] .. starts[k] + counts[k] - 1 (int64 arrays), row j of it in slot j. Returns the
 *     payloads and the sums of their members' record sizes. Every buffer is checked to hold what
 *     is read from it (ValueError if not).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Protobuf's wire types (groups, 3 and 4, are refused as Pulsar's own decoder refuses them). */
enum { WT_VARINT = 0, WT_FIXED64 = 1, WT_LEN = 2, WT_FIXED32 = 5 };

/* Fields of SingleMessageMetadata (api/pulsar/pulsar_api.proto). */
enum {
    F_PROPERTIES = 1,
    F_PARTITION_KEY = 2,
    F_PAYLOAD_SIZE = 3,
    F_COMPACTED_OUT = 4,
    F_EVENT_TIME = 5,
    F_ORDERING_KEY = 7,
    F_SEQUENCE_ID = 8,
    F_NULL_VALUE = 9,
};

/* Dedupe properties pairwise up to this many per member; by sorting above it (O(n log n) however
 * the names are chosen, unlike a hash table). */
#define PAIRWISE_MAX 16

typedef struct {
    const uint8_t *k;
    Py_ssize_t klen;
    const uint8_t *v;
    Py_ssize_t vlen;
    Py_ssize_t at; /* its place among the member's properties */
} Prop;

typedef struct {
    Prop *items;
    Py_ssize_t len, cap;
} Props;

typedef struct {
    int has_key;
    const uint8_t *key;
    Py_ssize_t key_len;
    int has_payload_size;
    int32_t payload_size;
    int compacted_out;
    uint64_t event_time;
    int has_ordering_key;
    const uint8_t *ordering_key;
    Py_ssize_t ordering_key_len;
    int has_sequence_id;
    uint64_t sequence_id;
    int null_value;
} Member;

/* ---- growable bytes ------------------------------------------------------------------------ */

typedef struct {
    PyObject *obj; /* a bytes object, resized as it fills; NULL until buf_init */
    Py_ssize_t len, cap;
} Buf;

static int buf_init(Buf *b, Py_ssize_t cap)
{
    if (cap < 16)
        cap = 16;
    b->obj = PyBytes_FromStringAndSize(NULL, cap);
    b->len = 0;
    b->cap = cap;
    return b->obj ? 0 : -1;
}

static char *buf_reserve(Buf *b, Py_ssize_t extra)
{
    if (extra > PY_SSIZE_T_MAX - b->len) {
        PyErr_NoMemory();
        return NULL;
    }
    if (b->len + extra > b->cap) {
        Py_ssize_t cap = b->cap;
        while (cap < b->len + extra)
            cap = cap > PY_SSIZE_T_MAX / 2 ? PY_SSIZE_T_MAX : cap * 2;
        if (_PyBytes_Resize(&b->obj, cap) < 0)
            return NULL;
        b->cap = cap;
    }
    return PyBytes_AS_STRING(b->obj) + b->len;
}

static inline int buf_append(Buf *b, const void *src, Py_ssize_t n)
{
    char *dst = buf_reserve(b, n);
    if (dst == NULL)
        return -1;
    if (n)
        memcpy(dst, src, (size_t)n);
    b->len += n;
    return 0;
}

static inline int buf_i32(Buf *b, int32_t x)
{
    return buf_append(b, &x, 4);
}

/* The bytes written (steals the buffer). */
static PyObject *buf_finish(Buf *b)
{
    PyObject *out;
    if (_PyBytes_Resize(&b->obj, b->len) < 0) {
        b->obj = NULL;
        return NULL;
    }
    out = b->obj;
    b->obj = NULL;
    return out;
}

/* A zeroed validity bitmap of n bits. */
static PyObject *bitmap_new(Py_ssize_t n)
{
    Py_ssize_t size = (n + 7) / 8;
    PyObject *b = PyBytes_FromStringAndSize(NULL, size);
    if (b)
        memset(PyBytes_AS_STRING(b), 0, (size_t)size);
    return b;
}

static inline void bit_set(PyObject *bitmap, Py_ssize_t i)
{
    ((uint8_t *)PyBytes_AS_STRING(bitmap))[i >> 3] |= (uint8_t)(1u << (i & 7));
}

/* ---- protobuf wire --------------------------------------------------------------------------- */

/* A varint of at most max_bytes bytes (bits past 64 dropped, as protobuf's parsers do). */
static inline int read_varint(const uint8_t **pp, const uint8_t *end, uint64_t *out, int max_bytes)
{
    const uint8_t *p = *pp;
    uint64_t v = 0;
    int i;
    for (i = 0; i < max_bytes; i++) {
        uint8_t b;
        if (p >= end)
            return -1;
        b = *p++;
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *pp = p;
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* A tag or a length: at most 5 bytes and 32 bits, as upb reads them. */
static inline int read_u32(const uint8_t **pp, const uint8_t *end, uint64_t *out)
{
    if (read_varint(pp, end, out, 5) < 0 || *out > 0xffffffffu)
        return -1;
    return 0;
}

static inline int read_len(const uint8_t **pp, const uint8_t *end, const uint8_t **start, Py_ssize_t *len)
{
    uint64_t n;
    if (read_u32(pp, end, &n) < 0 || n > (uint64_t)(end - *pp))
        return -1;
    *start = *pp;
    *len = (Py_ssize_t)n;
    *pp += n;
    return 0;
}

static const char *const BAD_WIRE_TYPE[8] = {
    "", "", "", "a field of wire type 3", "a field of wire type 4", "", "a field of wire type 6",
    "a field of wire type 7",
};

static int skip_field(const uint8_t **pp, const uint8_t *end, unsigned wire_type, const char **err)
{
    uint64_t v;
    const uint8_t *s;
    Py_ssize_t n;
    switch (wire_type) {
    case WT_VARINT:
        if (read_varint(pp, end, &v, 10) < 0)
            goto truncated;
        return 0;
    case WT_FIXED64:
        if (end - *pp < 8)
            goto truncated;
        *pp += 8;
        return 0;
    case WT_LEN:
        if (read_len(pp, end, &s, &n) < 0)
            goto truncated;
        return 0;
    case WT_FIXED32:
        if (end - *pp < 4)
            goto truncated;
        *pp += 4;
        return 0;
    default:
        *err = BAD_WIRE_TYPE[wire_type & 7];
        return -1;
    }
truncated:
    *err = "a field is cut off";
    return -1;
}

/* Strict UTF-8 (what Python's decoder and Arrow accept: no overlong forms, no surrogates,
 * nothing above U+10FFFF). */
static int utf8_valid(const uint8_t *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            uint64_t w;
            if (n - i >= 8) {
                memcpy(&w, s + i, 8);
                if (!(w & 0x8080808080808080ull)) {
                    i += 8;
                    continue;
                }
            }
            i++;
        } else if (c >= 0xc2 && c <= 0xdf) {
            if (n - i < 2 || (s[i + 1] & 0xc0) != 0x80)
                return 0;
            i += 2;
        } else if (c >= 0xe0 && c <= 0xef) {
            if (n - i < 3 || (s[i + 1] & 0xc0) != 0x80 || (s[i + 2] & 0xc0) != 0x80)
                return 0;
            if ((c == 0xe0 && s[i + 1] < 0xa0) || (c == 0xed && s[i + 1] > 0x9f))
                return 0;
            i += 3;
        } else if (c >= 0xf0 && c <= 0xf4) {
            if (n - i < 4 || (s[i + 1] & 0xc0) != 0x80 || (s[i + 2] & 0xc0) != 0x80 ||
                (s[i + 3] & 0xc0) != 0x80)
                return 0;
            if ((c == 0xf0 && s[i + 1] < 0x90) || (c == 0xf4 && s[i + 1] > 0x8f))
                return 0;
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

/* ---- properties ------------------------------------------------------------------------------- */

static int props_push(Props *ps, const Prop *p)
{
    if (ps->len == ps->cap) {
        Py_ssize_t cap = ps->cap ? ps->cap * 2 : 16;
        Prop *items = PyMem_RawRealloc(ps->items, (size_t)cap * sizeof(Prop));
        if (items == NULL)
            return -1;
        ps->items = items;
        ps->cap = cap;
    }
    ps->items[ps->len++] = *p;
    return 0;
}

static inline int same_key(const Prop *a, const Prop *b)
{
    return a->klen == b->klen && memcmp(a->k, b->k, (size_t)a->klen) == 0;
}

static int by_name_then_place(const void *a, const void *b)
{
    const Prop *x = a, *y = b;
    size_t n = (size_t)(x->klen < y->klen ? x->klen : y->klen);
    int c = n ? memcmp(x->k, y->k, n) : 0;
    if (c != 0)
        return c;
    if (x->klen != y->klen)
        return x->klen < y->klen ? -1 : 1;
    return (x->at > y->at) - (x->at < y->at);
}

static int by_place(const void *a, const void *b)
{
    const Prop *x = a, *y = b;
    return (x->at > y->at) - (x->at < y->at);
}

/* The properties as a dict of them holds them: each name once, where it first appears, with
 * the value it was given last. In place; returns the new count. */
static Py_ssize_t props_dedupe(Props *ps)
{
    Prop *it = ps->items;
    Py_ssize_t n = ps->len, m = 0, j, u;
    if (n < 2)
        return n;
    if (n <= PAIRWISE_MAX) {
        for (j = 0; j < n; j++) {
            for (u = 0; u < m; u++) {
                if (same_key(&it[u], &it[j])) {
                    it[u].v = it[j].v;
                    it[u].vlen = it[j].vlen;
                    break;
                }
            }
            if (u == m)
                it[m++] = it[j];
        }
        return m;
    }
    qsort(it, (size_t)n, sizeof(Prop), by_name_then_place);
    for (j = 0; j < n; j = u + 1) {
        /* it[j .. u]: one name, in the order given; m <= j, so it[m] is free to take it */
        for (u = j; u + 1 < n && same_key(&it[u + 1], &it[j]); u++)
            ;
        it[m] = it[j];
        it[m].v = it[u].v;
        it[m].vlen = it[u].vlen;
        m++;
    }
    qsort(it, (size_t)m, sizeof(Prop), by_place);
    return m;
}

/* ---- one member --------------------------------------------------------------------------- */

static int parse_key_value(const uint8_t *p, const uint8_t *end, Props *ps, const char **err)
{
    Prop prop = {(const uint8_t *)"", 0, (const uint8_t *)"", 0, ps->len};
    while (p < end) {
        uint64_t tag;
        unsigned field, wt;
        if (read_u32(&p, end, &tag) < 0) {
            *err = "a field is cut off";
            return -1;
        }
        field = (unsigned)(tag >> 3);
        wt = (unsigned)(tag & 7);
        if (field == 0) {
            *err = "a field numbered 0";
            return -1;
        }
        if ((field == 1 || field == 2) && wt == WT_LEN) {
            const uint8_t *s;
            Py_ssize_t n;
            if (read_len(&p, end, &s, &n) < 0) {
                *err = "a field is cut off";
                return -1;
            }
            if (!utf8_valid(s, n)) {
                *err = "a property that is not UTF-8";
                return -1;
            }
            if (field == 1) {
                prop.k = s;
                prop.klen = n;
            } else {
                prop.v = s;
                prop.vlen = n;
            }
        } else if (skip_field(&p, end, wt, err) < 0) {
            return -1;
        }
    }
    if (props_push(ps, &prop) < 0)
        return -2;
    return 0;
}

/* Parses one SingleMessageMetadata: 0, -1 (malformed, *err says why), -2 (Python error set). */
static int parse_member(const uint8_t *p, const uint8_t *end, Member *m, Props *ps, const char **err)
{
    /* Field by field, not memset: GCC makes that a `rep stos`, whose start-up and stores (which
     * the loads of the fields just after cannot take from the store buffer) cost about a third
     * of a walk of pulsar-perf's members (~20 -> ~13 ns a member checked). */
    m->has_key = 0;
    m->key = NULL;
    m->key_len = 0;
    m->has_payload_size = 0;
    m->payload_size = 0;
    m->compacted_out = 0;
    m->event_time = 0;
    m->has_ordering_key = 0;
    m->ordering_key = NULL;
    m->ordering_key_len = 0;
    m->has_sequence_id = 0;
    m->sequence_id = 0;
    m->null_value = 0;
    ps->len = 0;
    while (p < end) {
        uint64_t tag, v;
        unsigned field, wt;
        const uint8_t *s;
        Py_ssize_t n;
        if (read_u32(&p, end, &tag) < 0) {
            *err = "a field is cut off";
            return -1;
        }
        field = (unsigned)(tag >> 3);
        wt = (unsigned)(tag & 7);
        if (field == 0) {
            *err = "a field numbered 0";
            return -1;
        }
        if (wt == WT_VARINT) {
            switch (field) {
            case F_PAYLOAD_SIZE:
            case F_COMPACTED_OUT:
            case F_EVENT_TIME:
            case F_SEQUENCE_ID:
            case F_NULL_VALUE:
                if (read_varint(&p, end, &v, 10) < 0) {
                    *err = "a field is cut off";
                    return -1;
                }
                if (field == F_PAYLOAD_SIZE) {
                    m->has_payload_size = 1;
                    m->payload_size = (int32_t)(uint32_t)v;
                } else if (field == F_COMPACTED_OUT) {
                    m->compacted_out = v != 0;
                } else if (field == F_EVENT_TIME) {
                    m->event_time = v;
                } else if (field == F_SEQUENCE_ID) {
                    m->has_sequence_id = 1;
                    m->sequence_id = v;
                } else {
                    m->null_value = v != 0;
                }
                continue;
            default:
                break;
            }
        } else if (wt == WT_LEN &&
                   (field == F_PROPERTIES || field == F_PARTITION_KEY || field == F_ORDERING_KEY)) {
            int rc;
            if (read_len(&p, end, &s, &n) < 0) {
                *err = "a field is cut off";
                return -1;
            }
            if (field == F_PARTITION_KEY) {
                if (!utf8_valid(s, n)) {
                    *err = "a key that is not UTF-8";
                    return -1;
                }
                m->has_key = 1;
                m->key = s;
                m->key_len = n;
            } else if (field == F_ORDERING_KEY) {
                m->has_ordering_key = 1;
                m->ordering_key = s;
                m->ordering_key_len = n;
            } else if ((rc = parse_key_value(s, s + n, ps, err)) < 0) {
                return rc;
            }
            continue;
        }
        if (skip_field(&p, end, wt, err) < 0)
            return -1;
    }
    return 0;
}

/* ---- the batches ------------------------------------------------------------------------------ */

/* One batch to decode: a tuple of batch_codec.Batch's fields. */
typedef struct {
    long long first_entry;
    Py_ssize_t count;
    Py_buffer payload;
    long long publish_time;
    const char *producer;
    Py_ssize_t producer_len;
    long long first_sequence_id;
    int has_deliver_at;
    long long deliver_at;
    int has_ordering_key;
    Py_buffer ordering_key;
    int has_schema_version;
    Py_buffer schema_version;
} Batch;

static void batch_release(Batch *b)
{
    if (b->payload.obj)
        PyBuffer_Release(&b->payload);
    if (b->ordering_key.obj)
        PyBuffer_Release(&b->ordering_key);
    if (b->schema_version.obj)
        PyBuffer_Release(&b->schema_version);
}

/* Validity bitmaps, by column. */
enum { V_KEY, V_VALUE, V_EVENT, V_DELIVER, V_ORDERING, V_SCHEMA, N_VALID };

/* The columns, as Arrow buffers (int32 offsets, native byte order). */
typedef struct {
    PyObject *valid[N_VALID];
    Py_ssize_t nulls[N_VALID];
    PyObject *tombstones;
    Buf ledger_ids, entry_ids, key_offsets, key_data, value_offsets, value_data, map_offsets,
        name_offsets, name_data, text_offsets, text_data, publish_times, event_times, batch_indexes,
        batch_sizes, producer_offsets, producer_data, sequence_ids, deliver_at, ordering_offsets,
        ordering_data, schema_offsets, schema_data;
    Py_ssize_t row;
} Out;

#define N_BUFS 23
#define OUT_BUFS(o)                                                                                     \
    {                                                                                                   \
        &(o)->ledger_ids, &(o)->entry_ids, &(o)->key_offsets, &(o)->key_data, &(o)->value_offsets,      \
            &(o)->value_data, &(o)->map_offsets, &(o)->name_offsets, &(o)->name_data,                   \
            &(o)->text_offsets, &(o)->text_data, &(o)->publish_times, &(o)->event_times,                \
            &(o)->batch_indexes, &(o)->batch_sizes, &(o)->producer_offsets, &(o)->producer_data,        \
            &(o)->sequence_ids, &(o)->deliver_at, &(o)->ordering_offsets, &(o)->ordering_data,          \
            &(o)->schema_offsets, &(o)->schema_data                                                     \
    }

static void out_clear(Out *o)
{
    Buf *bufs[N_BUFS] = OUT_BUFS(o);
    int k;
    for (k = 0; k < N_BUFS; k++)
        Py_CLEAR(bufs[k]->obj);
    for (k = 0; k < N_VALID; k++)
        Py_CLEAR(o->valid[k]);
    Py_CLEAR(o->tombstones);
}

/* Sized for `rows` rows and `payload` bytes of payloads: only the keys, ordering keys and
 * properties may have to grow. */
static int out_init(Out *o, Py_ssize_t rows, Py_ssize_t payload, Py_ssize_t producers, Py_ssize_t schemas)
{
    Py_ssize_t offsets = 4 * (rows + 1), k;
    Buf *starts_at_zero[] = {&o->key_offsets,      &o->value_offsets,    &o->map_offsets,
                             &o->name_offsets,     &o->text_offsets,     &o->producer_offsets,
                             &o->ordering_offsets, &o->schema_offsets};
    memset(o, 0, sizeof(*o));
    if (buf_init(&o->ledger_ids, 8 * rows) < 0 || buf_init(&o->entry_ids, 8 * rows) < 0 ||
        buf_init(&o->key_offsets, offsets) < 0 || buf_init(&o->key_data, 64) < 0 ||
        buf_init(&o->value_offsets, offsets) < 0 || buf_init(&o->value_data, payload) < 0 ||
        buf_init(&o->map_offsets, offsets) < 0 || buf_init(&o->name_offsets, 64) < 0 ||
        buf_init(&o->name_data, 64) < 0 || buf_init(&o->text_offsets, 64) < 0 ||
        buf_init(&o->text_data, 64) < 0 || buf_init(&o->publish_times, 8 * rows) < 0 ||
        buf_init(&o->event_times, 8 * rows) < 0 || buf_init(&o->batch_indexes, 4 * rows) < 0 ||
        buf_init(&o->batch_sizes, 4 * rows) < 0 || buf_init(&o->producer_offsets, offsets) < 0 ||
        buf_init(&o->producer_data, producers) < 0 || buf_init(&o->sequence_ids, 8 * rows) < 0 ||
        buf_init(&o->deliver_at, 8 * rows) < 0 || buf_init(&o->ordering_offsets, offsets) < 0 ||
        buf_init(&o->ordering_data, 64) < 0 || buf_init(&o->schema_offsets, offsets) < 0 ||
        buf_init(&o->schema_data, schemas) < 0)
        return -1;
    for (k = 0; k < N_VALID; k++) {
        if ((o->valid[k] = bitmap_new(rows)) == NULL)
            return -1;
    }
    if ((o->tombstones = bitmap_new(rows)) == NULL)
        return -1;
    for (k = 0; k < (Py_ssize_t)(sizeof(starts_at_zero) / sizeof(starts_at_zero[0])); k++) {
        if (buf_i32(starts_at_zero[k], 0) < 0)
            return -1;
    }
    return 0;
}

/* Appends bytes to a variable-width column: data, then the end offset. */
static int column_append(Buf *offsets, Buf *data, const void *src, Py_ssize_t n)
{
    if (n > INT32_MAX - data->len) {
        PyErr_SetString(PyExc_ValueError, "the batches hold more than 2 GiB in one column");
        return -1;
    }
    if (buf_append(data, src, n) < 0)
        return -1;
    return buf_i32(offsets, (int32_t)data->len);
}

/* A value, or a null (`valid` 0), in a nullable variable-width column. */
static int column_maybe(Out *o, int column, Buf *offsets, Buf *data, int valid, const void *src, Py_ssize_t n)
{
    if (!valid) {
        o->nulls[column]++;
        return buf_i32(offsets, (int32_t)data->len);
    }
    bit_set(o->valid[column], o->row);
    return column_append(offsets, data, src, n);
}

static inline int buf_i64(Buf *b, long long x)
{
    int64_t v = (int64_t)x;
    return buf_append(b, &v, 8);
}

#define INT64_LIMIT ((uint64_t)INT64_MAX)

/* Why a walk failed: the reason for a ValueError in `reason`, or no memory, or (only where `o`
 * is given, with the GIL held) a Python error already set. */
typedef struct {
    char reason[192];
    int no_memory;
} Fault;

#define FAIL(...) (snprintf(fault->reason, sizeof(fault->reason), __VA_ARGS__))

/* Walks one batch; appends its rows to `o` when it is given (and `ledger_id` with them). Returns
 * the sum of the members' record sizes, or -1 (see Fault). `where` prefixes reasons. Without
 * `o`, touches no Python object: it may run without the GIL. */
static long long walk(const Batch *b, Py_ssize_t max_members, const char *where, Out *o, long long ledger_id,
                      Fault *fault)
{
    const uint8_t *p = b->payload.buf, *end = p + b->payload.len;
    Props ps = {NULL, 0, 0};
    unsigned long long size = 0;
    Py_ssize_t i, count = b->count;
    long long result = -1;

    if (count < 1 || count > max_members) {
        FAIL("%sa batch of %zd messages", where, count);
        return -1;
    }
    for (i = 0; i < count; i++) {
        Member m;
        const char *err = NULL;
        Py_ssize_t nprops, j;
        uint32_t meta_size;
        int rc;

        if (end - p < 4) {
            FAIL("%smember %zd: its metadata size is cut off", where, i);
            goto done;
        }
        meta_size = ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
        p += 4;
        if (meta_size > (uint64_t)(end - p)) {
            FAIL("%smember %zd: its metadata overruns the batch", where, i);
            goto done;
        }
        rc = parse_member(p, p + meta_size, &m, &ps, &err);
        if (rc == -2) {
            fault->no_memory = 1;
            goto done;
        }
        if (rc < 0) {
            FAIL("%smember %zd: its metadata does not parse: %s", where, i, err);
            goto done;
        }
        p += meta_size;
        if (!m.has_payload_size) {
            FAIL("%smember %zd: no payload size", where, i);
            goto done;
        }
        if (m.payload_size < 0) {
            FAIL("%smember %zd: a negative payload size", where, i);
            goto done;
        }
        if (m.payload_size > end - p) {
            FAIL("%smember %zd: its payload overruns the batch", where, i);
            goto done;
        }
        if (m.compacted_out) {
            /* Member i is stored at the batch's entry + i: a producer's batch has every member. */
            FAIL("%smember %zd is marked compacted out", where, i);
            goto done;
        }
        if (m.event_time > INT64_LIMIT) {
            FAIL("%smember %zd: an event time above 2**63 - 1", where, i);
            goto done;
        }
        if (m.has_sequence_id ? m.sequence_id > INT64_LIMIT
                              : b->first_sequence_id > INT64_MAX - (long long)i) {
            FAIL("%smember %zd: a sequence id above 2**63 - 1", where, i);
            goto done;
        }
        nprops = props_dedupe(&ps);
        size += (unsigned long long)(m.null_value ? 0 : m.payload_size);
        if (m.has_key)
            size += (unsigned long long)m.key_len;
        for (j = 0; j < nprops; j++)
            size += (unsigned long long)(ps.items[j].klen + ps.items[j].vlen);

        if (o != NULL) {
            long long seq = m.has_sequence_id ? (long long)m.sequence_id : b->first_sequence_id + i;
            int own_ok = m.has_ordering_key;
            if (buf_i64(&o->ledger_ids, ledger_id) < 0 || buf_i64(&o->entry_ids, b->first_entry + i) < 0 ||
                column_maybe(o, V_KEY, &o->key_offsets, &o->key_data, m.has_key, m.key, m.key_len) < 0 ||
                column_maybe(o, V_VALUE, &o->value_offsets, &o->value_data, !m.null_value, p,
                             m.payload_size) < 0)
                goto done;
            if (m.null_value || (m.payload_size == 0 && m.has_key))
                bit_set(o->tombstones, o->row);
            for (j = 0; j < nprops; j++) {
                if (column_append(&o->name_offsets, &o->name_data, ps.items[j].k, ps.items[j].klen) < 0 ||
                    column_append(&o->text_offsets, &o->text_data, ps.items[j].v, ps.items[j].vlen) < 0)
                    goto done;
            }
            if (o->name_offsets.len / 4 - 1 > INT32_MAX) {
                PyErr_SetString(PyExc_ValueError, "the batches hold more than 2**31 properties");
                goto done;
            }
            if (buf_i32(&o->map_offsets, (int32_t)(o->name_offsets.len / 4 - 1)) < 0 ||
                buf_i64(&o->publish_times, b->publish_time) < 0 ||
                buf_i64(&o->event_times, (long long)m.event_time) < 0)
                goto done;
            if (m.event_time != 0)
                bit_set(o->valid[V_EVENT], o->row);
            else
                o->nulls[V_EVENT]++;
            if (buf_i32(&o->batch_indexes, (int32_t)i) < 0 || buf_i32(&o->batch_sizes, (int32_t)count) < 0 ||
                column_append(&o->producer_offsets, &o->producer_data, b->producer, b->producer_len) < 0 ||
                buf_i64(&o->sequence_ids, seq) < 0 ||
                buf_i64(&o->deliver_at, b->has_deliver_at ? b->deliver_at : 0) < 0)
                goto done;
            if (b->has_deliver_at)
                bit_set(o->valid[V_DELIVER], o->row);
            else
                o->nulls[V_DELIVER]++;
            if (column_maybe(o, V_ORDERING, &o->ordering_offsets, &o->ordering_data,
                             own_ok || b->has_ordering_key, own_ok ? m.ordering_key : b->ordering_key.buf,
                             own_ok ? m.ordering_key_len : b->ordering_key.len) < 0 ||
                column_maybe(o, V_SCHEMA, &o->schema_offsets, &o->schema_data, b->has_schema_version,
                             b->schema_version.buf, b->schema_version.len) < 0)
                goto done;
            o->row++;
        }
        p += m.payload_size;
    }
    if (p != end) {
        FAIL("%s%zd bytes after its members", where, (Py_ssize_t)(end - p));
        goto done;
    }
    result = (long long)size;
done:
    PyMem_RawFree(ps.items);
    return result;
}

/* The exception for a failed walk. */
static PyObject *raise_fault(const Fault *fault)
{
    if (fault->no_memory)
        return PyErr_NoMemory();
    if (fault->reason[0])
        PyErr_SetString(PyExc_ValueError, fault->reason);
    return NULL;
}

/* A check of a payload this big runs without the GIL (the produce path checks batches on worker
 * threads; below it, handing the GIL over would cost more than the walk). */
#define RELEASE_GIL_FROM (64 * 1024)

static PyObject *codec_check(PyObject *self, PyObject *args)
{
    Batch b;
    Py_ssize_t max_members;
    long long size;
    (void)self;
    Fault fault = {"", 0};
    memset(&b, 0, sizeof(b));
    if (!PyArg_ParseTuple(args, "y*nnL:check", &b.payload, &b.count, &max_members, &b.first_sequence_id))
        return NULL;
    if (b.payload.len >= RELEASE_GIL_FROM) {
        Py_BEGIN_ALLOW_THREADS
        size = walk(&b, max_members, "", NULL, 0, &fault);
        Py_END_ALLOW_THREADS
    } else {
        size = walk(&b, max_members, "", NULL, 0, &fault);
    }
    batch_release(&b);
    return size < 0 ? raise_fault(&fault) : PyLong_FromLongLong(size);
}

/* A bitmap (taken from `*bitmap`), or None for a validity bitmap without nulls. */
static PyObject *validity(PyObject **bitmap, Py_ssize_t nulls)
{
    PyObject *b = *bitmap;
    *bitmap = NULL;
    if (nulls == 0) {
        Py_DECREF(b);
        Py_RETURN_NONE;
    }
    return b;
}

static int optional_buffer(PyObject *obj, int *has, Py_buffer *view)
{
    *has = obj != Py_None;
    return *has ? PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) : 0;
}

/* The fields of one batch_codec.Batch. */
static int batch_parse(PyObject *item, Batch *b)
{
    PyObject *payload, *producer, *deliver_at, *ordering_key, *schema_version;
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 9) {
        PyErr_SetString(PyExc_TypeError, "a batch is a batch_codec.Batch");
        return -1;
    }
    if (!PyArg_ParseTuple(item, "LnOLULOOO", &b->first_entry, &b->count, &payload, &b->publish_time,
                          &producer, &b->first_sequence_id, &deliver_at, &ordering_key, &schema_version))
        return -1;
    if ((b->producer = PyUnicode_AsUTF8AndSize(producer, &b->producer_len)) == NULL)
        return -1;
    if (PyObject_GetBuffer(payload, &b->payload, PyBUF_SIMPLE) < 0)
        return -1;
    b->has_deliver_at = deliver_at != Py_None;
    if (b->has_deliver_at) {
        b->deliver_at = PyLong_AsLongLong(deliver_at);
        if (b->deliver_at == -1 && PyErr_Occurred())
            return -1;
    }
    if (optional_buffer(ordering_key, &b->has_ordering_key, &b->ordering_key) < 0 ||
        optional_buffer(schema_version, &b->has_schema_version, &b->schema_version) < 0)
        return -1;
    return 0;
}

static PyObject *codec_decode(PyObject *self, PyObject *args)
{
    PyObject *sequence, *items, *result = NULL;
    Py_ssize_t max_members, nbatches, k, rows = 0, payload = 0, producers = 0, schemas = 0;
    long long ledger_id, size = 0;
    Batch *batches = NULL;
    Out o;
    int out_ready = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "LOn:decode", &ledger_id, &sequence, &max_members))
        return NULL;
    if ((items = PySequence_Fast(sequence, "batches must be a sequence")) == NULL)
        return NULL;
    nbatches = PySequence_Fast_GET_SIZE(items);
    batches = PyMem_Calloc(nbatches ? (size_t)nbatches : 1, sizeof(Batch));
    if (batches == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (k = 0; k < nbatches; k++) {
        Batch *b = &batches[k];
        if (batch_parse(PySequence_Fast_GET_ITEM(items, k), b) < 0)
            goto done;
        /* Room for the rows the batch can have: a count out of range is the walk's to report
         * (in order, after the batches before it), and every member takes 4 bytes at least. */
        if (b->count >= 1 && b->count <= max_members) {
            Py_ssize_t most = b->count < b->payload.len / 4 ? b->count : b->payload.len / 4;
            rows += most;
            producers += most * b->producer_len;
            schemas += b->has_schema_version ? most * b->schema_version.len : 0;
        }
        payload += b->payload.len;
    }
    if (out_init(&o, rows, payload, producers, schemas) < 0) {
        out_ready = 1;
        goto done;
    }
    out_ready = 1;
    for (k = 0; k < nbatches; k++) {
        char where[64] = "";
        long long s;
        if (nbatches > 1)
            PyOS_snprintf(where, sizeof(where), "the batch at entry %lld: ", batches[k].first_entry);
        Fault fault = {"", 0};
        if ((s = walk(&batches[k], max_members, where, &o, ledger_id, &fault)) < 0) {
            raise_fault(&fault);
            goto done;
        }
        size += s;
    }
    {
        /* The order of batch_codec.Columns. */
        PyObject *fields[] = {
            PyLong_FromLongLong(size),
            buf_finish(&o.ledger_ids),
            buf_finish(&o.entry_ids),
            validity(&o.valid[V_KEY], o.nulls[V_KEY]),
            PyLong_FromSsize_t(o.nulls[V_KEY]),
            buf_finish(&o.key_offsets),
            buf_finish(&o.key_data),
            validity(&o.valid[V_VALUE], o.nulls[V_VALUE]),
            PyLong_FromSsize_t(o.nulls[V_VALUE]),
            buf_finish(&o.value_offsets),
            buf_finish(&o.value_data),
            validity(&o.tombstones, -1),
            buf_finish(&o.map_offsets),
            buf_finish(&o.name_offsets),
            buf_finish(&o.name_data),
            buf_finish(&o.text_offsets),
            buf_finish(&o.text_data),
            buf_finish(&o.publish_times),
            validity(&o.valid[V_EVENT], o.nulls[V_EVENT]),
            PyLong_FromSsize_t(o.nulls[V_EVENT]),
            buf_finish(&o.event_times),
            buf_finish(&o.batch_indexes),
            buf_finish(&o.batch_sizes),
            buf_finish(&o.producer_offsets),
            buf_finish(&o.producer_data),
            buf_finish(&o.sequence_ids),
            validity(&o.valid[V_DELIVER], o.nulls[V_DELIVER]),
            PyLong_FromSsize_t(o.nulls[V_DELIVER]),
            buf_finish(&o.deliver_at),
            validity(&o.valid[V_ORDERING], o.nulls[V_ORDERING]),
            PyLong_FromSsize_t(o.nulls[V_ORDERING]),
            buf_finish(&o.ordering_offsets),
            buf_finish(&o.ordering_data),
            validity(&o.valid[V_SCHEMA], o.nulls[V_SCHEMA]),
            PyLong_FromSsize_t(o.nulls[V_SCHEMA]),
            buf_finish(&o.schema_offsets),
            buf_finish(&o.schema_data),
        };
        Py_ssize_t n = (Py_ssize_t)(sizeof(fields) / sizeof(fields[0])), f;
        int failed = 0;
        for (f = 0; f < n; f++)
            failed |= fields[f] == NULL;
        if (!failed)
            result = PyTuple_New(n);
        for (f = 0; f < n; f++) {
            if (result != NULL)
                PyTuple_SET_ITEM(result, f, fields[f]);
            else
                Py_XDECREF(fields[f]);
        }
    }
done:
    if (out_ready)
        out_clear(&o);
    if (batches != NULL) {
        for (k = 0; k < nbatches; k++)
            batch_release(&batches[k]);
        PyMem_Free(batches);
    }
    Py_DECREF(items);
    return result;
}

/* ---- a consumer's batch: members encoded back -------------------------------------------------- */

/* The items of a ledger.entry.Entry the encoder reads (tests/ledger/test_batch_encoder.py checks
 * them against Entry._fields). */
enum {
    E_KEY = 2,
    E_VALUE = 3,
    E_PROPERTIES = 4,
    E_EVENT_TIME = 6,
    E_BATCH_INDEX = 7,
    E_SEQUENCE_ID = 10,
    E_ORDERING_KEY = 12,
    E_FIELDS = 14,
};

/* One-byte tags of SingleMessageMetadata's fields (field << 3 | wire type) and KeyValue's. */
enum {
    T_PROPERTIES = F_PROPERTIES << 3 | WT_LEN,
    T_PARTITION_KEY = F_PARTITION_KEY << 3 | WT_LEN,
    T_PAYLOAD_SIZE = F_PAYLOAD_SIZE << 3 | WT_VARINT,
    T_EVENT_TIME = F_EVENT_TIME << 3 | WT_VARINT,
    T_ORDERING_KEY = F_ORDERING_KEY << 3 | WT_LEN,
    T_SEQUENCE_ID = F_SEQUENCE_ID << 3 | WT_VARINT,
    T_NULL_VALUE = F_NULL_VALUE << 3 | WT_VARINT,
    T_KV_KEY = 1 << 3 | WT_LEN,
    T_KV_VALUE = 2 << 3 | WT_LEN,
};

/* An empty slot (batch_encoder.PLACEHOLDER): its size, then SingleMessageMetadata{payload_size: 0,
 * compacted_out: true}. */
static const char PLACEHOLDER[8] = {0, 0, 0, 4, 0x18, 0x00, 0x20, 0x01};

static inline Py_ssize_t varint_size(uint64_t v)
{
    Py_ssize_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline char *put_varint(char *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (char)(v | 0x80);
        v >>= 7;
    }
    *p++ = (char)v;
    return p;
}

/* A length-delimited field: tag, length, bytes. */
static inline Py_ssize_t field_size(Py_ssize_t n)
{
    return 1 + varint_size((uint64_t)n) + n;
}

static inline char *put_field(char *p, uint8_t tag, const char *s, Py_ssize_t n)
{
    *p++ = (char)tag;
    p = put_varint(p, (uint64_t)n);
    if (n)
        memcpy(p, s, (size_t)n);
    return p + n;
}

/* A bytes-like item of an entry (a view held when it is not bytes: release with bytes_release). */
typedef struct {
    const char *p;
    Py_ssize_t n;
    Py_buffer view;
} Bytes;

static int bytes_of(PyObject *obj, Bytes *b, Py_ssize_t member, const char *what)
{
    if (PyBytes_Check(obj)) {
        b->p = PyBytes_AS_STRING(obj);
        b->n = PyBytes_GET_SIZE(obj);
        return 0;
    }
    if (!PyObject_CheckBuffer(obj)) {
        PyErr_Format(PyExc_TypeError, "member %zd: its %s is %.80s, not bytes", member, what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (PyObject_GetBuffer(obj, &b->view, PyBUF_SIMPLE) < 0) {
        b->view.obj = NULL;
        return -1;
    }
    b->p = b->view.buf;
    b->n = b->view.len;
    return 0;
}

static void bytes_release(Bytes *b)
{
    if (b->view.obj)
        PyBuffer_Release(&b->view);
}

static const char *utf8_of(PyObject *obj, Py_ssize_t *n, Py_ssize_t member, const char *what)
{
    if (!PyUnicode_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "member %zd: its %s is %.80s, not str", member, what, Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return PyUnicode_AsUTF8AndSize(obj, n); /* UnicodeEncodeError for a lone surrogate, as str.encode */
}

/* An int item as a varint carries it: its low 64 bits (a negative as two's complement). */
static int u64_of(PyObject *obj, uint64_t *v, Py_ssize_t member, const char *what)
{
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "member %zd: its %s is %.80s, not int", member, what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    *v = (uint64_t)PyLong_AsUnsignedLongLongMask(obj);
    return *v == (uint64_t)-1 && PyErr_Occurred() ? -1 : 0;
}

/* The properties of an entry, pair by pair: a dict's own (in its order), or what a subclass's
 * items() gives. */
typedef struct {
    PyObject *dict;  /* an exact dict, read with PyDict_Next */
    PyObject *items; /* else the list of its items() */
    Py_ssize_t pos;
} Pairs;

static int pairs_start(Pairs *it, PyObject *props, Py_ssize_t member)
{
    it->dict = it->items = NULL;
    it->pos = 0;
    if (props == Py_None || PyDict_CheckExact(props)) {
        it->dict = props == Py_None || PyDict_GET_SIZE(props) == 0 ? NULL : props;
        return 0;
    }
    if (!PyDict_Check(props)) {
        PyErr_Format(PyExc_TypeError, "member %zd: its properties are %.80s, not a dict", member,
                     Py_TYPE(props)->tp_name);
        return -1;
    }
    it->items = PyMapping_Items(props);
    return it->items ? 0 : -1;
}

/* 1 and the next pair's UTF-8, 0 at the end, -1 on an error. */
static int pairs_next(Pairs *it, const char **k, Py_ssize_t *kn, const char **v, Py_ssize_t *vn, Py_ssize_t member)
{
    PyObject *key, *value;
    if (it->dict != NULL) {
        if (!PyDict_Next(it->dict, &it->pos, &key, &value))
            return 0;
    } else if (it->items != NULL && it->pos < PyList_GET_SIZE(it->items)) {
        PyObject *pair = PyList_GET_ITEM(it->items, it->pos++);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_Format(PyExc_TypeError, "member %zd: its properties' items are not pairs", member);
            return -1;
        }
        key = PyTuple_GET_ITEM(pair, 0);
        value = PyTuple_GET_ITEM(pair, 1);
    } else {
        return 0;
    }
    if ((*k = utf8_of(key, kn, member, "property name")) == NULL ||
        (*v = utf8_of(value, vn, member, "property value")) == NULL)
        return -1;
    return 1;
}

/* Appends member `e` (slot `member` of the batch): u32 big-endian size | SingleMessageMetadata | value, the
 * bytes api.pulsar.messages wrote with protobuf's field order (single_metadata). */
static int encode_member(Buf *out, PyObject *e, Py_ssize_t member)
{
    PyObject *key = PyTuple_GET_ITEM(e, E_KEY), *value = PyTuple_GET_ITEM(e, E_VALUE),
             *props = PyTuple_GET_ITEM(e, E_PROPERTIES), *event = PyTuple_GET_ITEM(e, E_EVENT_TIME),
             *seq = PyTuple_GET_ITEM(e, E_SEQUENCE_ID), *okey = PyTuple_GET_ITEM(e, E_ORDERING_KEY);
    Bytes v, ok; /* (not zeroed whole: a Py_buffer's rep stos was half the time of a member) */
    const char *k = NULL, *pk, *pv;
    Py_ssize_t klen = 0, pkn, pvn, meta = 0, pair;
    uint64_t event_time = 0, sequence_id = 0;
    int has_event = 0, has_props = 0, rc = -1, more;
    Pairs it = {NULL, NULL, 0};
    char *p;

    v.p = ok.p = "";
    v.n = ok.n = 0;
    v.view.obj = ok.view.obj = NULL;
    if (key != Py_None) {
        if ((k = utf8_of(key, &klen, member, "key")) == NULL)
            goto done;
        meta += field_size(klen);
    }
    if (value != Py_None && bytes_of(value, &v, member, "value") < 0)
        goto done;
    meta += 1 + varint_size((uint64_t)v.n);
    if (event != Py_None) {
        /* Sent when it is truthy (0 is no event time). */
        if (u64_of(event, &event_time, member, "event time") < 0 || (has_event = PyObject_IsTrue(event)) < 0)
            goto done;
        if (has_event)
            meta += 1 + varint_size(event_time);
    }
    if (okey != Py_None) {
        if (bytes_of(okey, &ok, member, "ordering key") < 0)
            goto done;
        meta += field_size(ok.n);
    }
    if (seq != Py_None) {
        if (u64_of(seq, &sequence_id, member, "sequence id") < 0)
            goto done;
        meta += 1 + varint_size(sequence_id);
    }
    if (value == Py_None)
        meta += 2;
    if (pairs_start(&it, props, member) < 0)
        goto done;
    while ((more = pairs_next(&it, &pk, &pkn, &pv, &pvn, member)) > 0) {
        meta += field_size(field_size(pkn) + field_size(pvn));
        has_props = 1;
    }
    if (more < 0)
        goto done;
    if ((uint64_t)meta > 0xffffffffu) {
        PyErr_Format(PyExc_ValueError, "member %zd: its metadata is over 4 GiB", member);
        goto done;
    }
    if (v.n > PY_SSIZE_T_MAX - 4 - meta) {
        PyErr_NoMemory();
        goto done;
    }
    if ((p = buf_reserve(out, 4 + meta + v.n)) == NULL)
        goto done;
    out->len += 4 + meta + v.n;
    *p++ = (char)(meta >> 24);
    *p++ = (char)(meta >> 16);
    *p++ = (char)(meta >> 8);
    *p++ = (char)meta;
    if (has_props) {
        it.pos = 0; /* again, as counted: no Python code ran in between */
        while (pairs_next(&it, &pk, &pkn, &pv, &pvn, member) > 0) {
            pair = field_size(pkn) + field_size(pvn);
            *p++ = (char)T_PROPERTIES;
            p = put_varint(p, (uint64_t)pair);
            p = put_field(p, T_KV_KEY, pk, pkn);
            p = put_field(p, T_KV_VALUE, pv, pvn);
        }
    }
    if (k != NULL)
        p = put_field(p, T_PARTITION_KEY, k, klen);
    *p++ = (char)T_PAYLOAD_SIZE;
    p = put_varint(p, (uint64_t)v.n);
    if (has_event) {
        *p++ = (char)T_EVENT_TIME;
        p = put_varint(p, event_time);
    }
    if (okey != Py_None)
        p = put_field(p, T_ORDERING_KEY, ok.p, ok.n);
    if (seq != Py_None) {
        *p++ = (char)T_SEQUENCE_ID;
        p = put_varint(p, sequence_id);
    }
    if (value == Py_None) {
        *p++ = (char)T_NULL_VALUE;
        *p++ = 1;
    }
    if (v.n)
        memcpy(p, v.p, (size_t)v.n);
    rc = 0;
done:
    Py_XDECREF(it.items);
    bytes_release(&v);
    bytes_release(&ok);
    return rc;
}

static PyObject *codec_encode(PyObject *self, PyObject *args)
{
    PyObject *sequence, *entries, *result = NULL, **slots = NULL;
    Py_ssize_t n, count, i, guess;
    Buf out = {NULL, 0, 0};
    (void)self;
    if (!PyArg_ParseTuple(args, "On:encode", &sequence, &n))
        return NULL;
    if (n < 0) {
        PyErr_Format(PyExc_ValueError, "a batch of %zd messages", n);
        return NULL;
    }
    /* A tuple of its own: the slots borrow from it whatever Python code a dict subclass's
     * items() runs. */
    if ((entries = PySequence_Tuple(sequence)) == NULL)
        return NULL;
    count = PyTuple_GET_SIZE(entries);
    if (n > PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(PyObject *) ||
        (slots = PyMem_Calloc(n ? (size_t)n : 1, sizeof(PyObject *))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* Each slot's member, the last given for it (as a dict of them keeps it); an index out of
     * the batch has no slot. */
    guess = 8 * n;
    for (i = 0; i < count; i++) {
        PyObject *e = PyTuple_GET_ITEM(entries, i), *index;
        long long at;
        int overflow;
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != E_FIELDS) {
            PyErr_Format(PyExc_TypeError, "entry %zd is %.80s, not a ledger.entry.Entry", i, Py_TYPE(e)->tp_name);
            goto done;
        }
        index = PyTuple_GET_ITEM(e, E_BATCH_INDEX);
        if (index == Py_None)
            continue;
        if (!PyLong_Check(index)) {
            PyErr_Format(PyExc_TypeError, "entry %zd: its batch index is %.80s, not int", i, Py_TYPE(index)->tp_name);
            goto done;
        }
        at = PyLong_AsLongLongAndOverflow(index, &overflow);
        if (at == -1 && PyErr_Occurred())
            goto done;
        if (overflow || at < 0 || at >= n)
            continue;
        slots[at] = e;
        if (PyBytes_Check(PyTuple_GET_ITEM(e, E_VALUE)) &&
            PyBytes_GET_SIZE(PyTuple_GET_ITEM(e, E_VALUE)) < PY_SSIZE_T_MAX / 2 - guess)
            guess += 24 + PyBytes_GET_SIZE(PyTuple_GET_ITEM(e, E_VALUE));
    }
    if (buf_init(&out, guess) < 0)
        goto done;
    for (i = 0; i < n; i++) {
        if (slots[i] == NULL) {
            if (buf_append(&out, PLACEHOLDER, sizeof(PLACEHOLDER)) < 0)
                goto done;
        } else if (encode_member(&out, slots[i], i) < 0) {
            goto done;
        }
    }
    result = buf_finish(&out);
done:
    Py_XDECREF(out.obj);
    PyMem_Free(slots);
    Py_DECREF(entries);
    return result;
}

/* ---- a consumer's batches, encoded from a sealed ledger's columns ----------------------------- */

/* A column of a table slice, as Arrow lays it out: its first row at `offset` in its buffers, a
 * validity bitmap (absent: no nulls), int32 offsets and data (variable width) or 8-byte numbers
 * (data only). Absent altogether (`present` 0): a column every row of which is null. */
typedef struct {
    int present;
    Py_ssize_t length, offset;
    Py_buffer valid, offsets, data;
} Col;

static void col_release(Col *c)
{
    if (c->valid.obj)
        PyBuffer_Release(&c->valid);
    if (c->offsets.obj)
        PyBuffer_Release(&c->offsets);
    if (c->data.obj)
        PyBuffer_Release(&c->data);
}

/* Fills `c` from None or a tuple (length, offset, validity, offsets, data), each buffer None or
 * bytes-like; checks that the buffers hold `length` rows from `offset` (`width` bytes a value,
 * 0 for a variable-width column), so that no read below goes outside them. `need` is the rows
 * the caller will read. */
static int col_parse(PyObject *obj, Col *c, int width, Py_ssize_t need, const char *name)
{
    PyObject *valid, *offsets, *data;
    Py_ssize_t end;
    memset(c, 0, sizeof(*c));
    if (obj == Py_None)
        return 0;
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) != 5) {
        PyErr_Format(PyExc_TypeError, "column %s: not (length, offset, validity, offsets, data)", name);
        return -1;
    }
    if (!PyArg_ParseTuple(obj, "nnOOO", &c->length, &c->offset, &valid, &offsets, &data))
        return -1;
    c->present = 1;
    if (c->length < need || c->offset < 0 || c->offset > PY_SSIZE_T_MAX / 16 - c->length) {
        PyErr_Format(PyExc_ValueError, "column %s: %zd rows at %zd, %zd needed", name, c->length, c->offset, need);
        return -1;
    }
    end = c->offset + c->length;
    if ((valid != Py_None && PyObject_GetBuffer(valid, &c->valid, PyBUF_SIMPLE) < 0) ||
        (offsets != Py_None && PyObject_GetBuffer(offsets, &c->offsets, PyBUF_SIMPLE) < 0) ||
        (data != Py_None && PyObject_GetBuffer(data, &c->data, PyBUF_SIMPLE) < 0))
        return -1;
    if (c->valid.obj && c->valid.len < (end + 7) / 8)
        goto short_buffer;
    if (width ? (c->data.obj == NULL || c->data.len / width < end)
              : (c->offsets.obj == NULL || c->offsets.len / 4 < end + 1 || c->data.obj == NULL))
        goto short_buffer;
    return 0;
short_buffer:
    PyErr_Format(PyExc_ValueError, "column %s: its buffers do not hold %zd rows at %zd", name, c->length, c->offset);
    return -1;
}

/* Whether row `i` of a column has a value. */
static inline int col_valid(const Col *c, Py_ssize_t i)
{
    Py_ssize_t at;
    if (!c->present)
        return 0;
    if (c->valid.obj == NULL)
        return 1;
    at = c->offset + i;
    return (((const uint8_t *)c->valid.buf)[at >> 3] >> (at & 7)) & 1;
}

static inline int64_t col_i64(const Col *c, Py_ssize_t i)
{
    int64_t v;
    memcpy(&v, (const char *)c->data.buf + 8 * (c->offset + i), 8);
    return v;
}

static inline int32_t col_offset(const Col *c, Py_ssize_t i)
{
    int32_t v;
    memcpy(&v, (const char *)c->offsets.buf + 4 * (c->offset + i), 4);
    return v;
}

/* Row `i` of a variable-width column (its offsets checked against its data). */
static int col_bytes(const Col *c, Py_ssize_t i, const char **p, Py_ssize_t *n, const char *name)
{
    int32_t a = col_offset(c, i), b = col_offset(c, i + 1);
    if (a < 0 || b < a || b > c->data.len) {
        PyErr_Format(PyExc_ValueError, "column %s: row %zd lies outside its data", name, i);
        return -1;
    }
    *p = (const char *)c->data.buf + a;
    *n = b - a;
    return 0;
}

/* The columns of a member, and the properties map (offsets into `names` and `texts`). */
typedef struct {
    Col key, value, props, names, texts, event, okey, seq;
} Rows;

static void rows_release(Rows *r)
{
    col_release(&r->key);
    col_release(&r->value);
    col_release(&r->props);
    col_release(&r->names);
    col_release(&r->texts);
    col_release(&r->event);
    col_release(&r->okey);
    col_release(&r->seq);
}

/* The properties of row `i`, as a dict of the map's pairs holds them (props_dedupe): what
 * table_to_entries makes of a map. A null map has none. */
static int row_props(const Rows *r, Py_ssize_t i, Props *ps)
{
    int32_t a, b, j;
    ps->len = 0;
    if (!col_valid(&r->props, i))
        return 0;
    a = col_offset(&r->props, i);
    b = col_offset(&r->props, i + 1);
    if (a < 0 || b < a || b > r->names.length || b > r->texts.length) {
        PyErr_Format(PyExc_ValueError, "column properties: row %zd lies outside its pairs", i);
        return -1;
    }
    for (j = a; j < b; j++) {
        Prop prop;
        const char *k, *v;
        if (!col_valid(&r->names, j) || !col_valid(&r->texts, j)) {
            PyErr_Format(PyExc_ValueError, "row %zd: a property name or value is null", i);
            return -1;
        }
        if (col_bytes(&r->names, j, &k, &prop.klen, "properties' names") < 0 ||
            col_bytes(&r->texts, j, &v, &prop.vlen, "properties' values") < 0)
            return -1;
        prop.k = (const uint8_t *)k;
        prop.v = (const uint8_t *)v;
        prop.at = ps->len;
        if (props_push(ps, &prop) < 0) {
            PyErr_NoMemory();
            return -1;
        }
    }
    ps->len = props_dedupe(ps);
    return 0;
}

/* Appends row `i` as a member (encode_member's bytes for the Entry table_to_entries makes of
 * the row) and adds its record size to `*size`. */
static int encode_row(Buf *out, const Rows *r, Py_ssize_t i, Props *ps, unsigned long long *size)
{
    const char *k = NULL, *v = "", *ok = NULL;
    Py_ssize_t klen = 0, vlen = 0, oklen = 0, meta = 0, j;
    int has_key = col_valid(&r->key, i), has_value = col_valid(&r->value, i);
    int has_okey = col_valid(&r->okey, i), has_seq = col_valid(&r->seq, i);
    uint64_t event_time = col_valid(&r->event, i) ? (uint64_t)col_i64(&r->event, i) : 0;
    uint64_t sequence_id = has_seq ? (uint64_t)col_i64(&r->seq, i) : 0;
    char *p;

    if (row_props(r, i, ps) < 0)
        return -1;
    for (j = 0; j < ps->len; j++) {
        meta += field_size(field_size(ps->items[j].klen) + field_size(ps->items[j].vlen));
        *size += (unsigned long long)(ps->items[j].klen + ps->items[j].vlen);
    }
    if (has_key) {
        if (col_bytes(&r->key, i, &k, &klen, "key") < 0)
            return -1;
        meta += field_size(klen);
        *size += (unsigned long long)klen;
    }
    if (has_value && col_bytes(&r->value, i, &v, &vlen, "value") < 0)
        return -1;
    *size += (unsigned long long)vlen;
    meta += 1 + varint_size((uint64_t)vlen);
    if (event_time) /* 0 is no event time */
        meta += 1 + varint_size(event_time);
    if (has_okey) {
        if (col_bytes(&r->okey, i, &ok, &oklen, "ordering key") < 0)
            return -1;
        meta += field_size(oklen);
    }
    if (has_seq)
        meta += 1 + varint_size(sequence_id);
    if (!has_value)
        meta += 2;
    if ((uint64_t)meta > 0xffffffffu) {
        PyErr_Format(PyExc_ValueError, "row %zd: its metadata is over 4 GiB", i);
        return -1;
    }
    if ((p = buf_reserve(out, 4 + meta + vlen)) == NULL)
        return -1;
    out->len += 4 + meta + vlen;
    *p++ = (char)(meta >> 24);
    *p++ = (char)(meta >> 16);
    *p++ = (char)(meta >> 8);
    *p++ = (char)meta;
    for (j = 0; j < ps->len; j++) {
        const Prop *q = &ps->items[j];
        *p++ = (char)T_PROPERTIES;
        p = put_varint(p, (uint64_t)(field_size(q->klen) + field_size(q->vlen)));
        p = put_field(p, T_KV_KEY, (const char *)q->k, q->klen);
        p = put_field(p, T_KV_VALUE, (const char *)q->v, q->vlen);
    }
    if (has_key)
        p = put_field(p, T_PARTITION_KEY, k, klen);
    *p++ = (char)T_PAYLOAD_SIZE;
    p = put_varint(p, (uint64_t)vlen);
    if (event_time) {
        *p++ = (char)T_EVENT_TIME;
        p = put_varint(p, event_time);
    }
    if (has_okey)
        p = put_field(p, T_ORDERING_KEY, ok, oklen);
    if (has_seq) {
        *p++ = (char)T_SEQUENCE_ID;
        p = put_varint(p, sequence_id);
    }
    if (!has_value) {
        *p++ = (char)T_NULL_VALUE;
        *p++ = 1;
    }
    if (vlen)
        memcpy(p, v, (size_t)vlen);
    return 0;
}

static PyObject *codec_encode_rows(PyObject *self, PyObject *args)
{
    PyObject *key, *value, *props, *names, *texts, *event, *okey, *seq, *payloads = NULL, *sizes = NULL,
                                                                       *result = NULL;
    Py_buffer starts = {0}, counts = {0};
    Py_ssize_t rows, nbatches, k;
    Rows r;
    Props ps = {NULL, 0, 0};
    (void)self;
    memset(&r, 0, sizeof(r));
    if (!PyArg_ParseTuple(args, "nOOOOOOOOy*y*:encode_rows", &rows, &key, &value, &props, &names, &texts, &event,
                          &okey, &seq, &starts, &counts))
        return NULL;
    /* The pairs are as many as the map's offsets say, checked row by row against their lengths. */
    if (rows < 0 || col_parse(key, &r.key, 0, rows, "key") < 0 || col_parse(value, &r.value, 0, rows, "value") < 0 ||
        col_parse(props, &r.props, 0, rows, "properties") < 0 ||
        col_parse(names, &r.names, 0, 0, "properties' names") < 0 ||
        col_parse(texts, &r.texts, 0, 0, "properties' values") < 0 ||
        col_parse(event, &r.event, 8, rows, "event_time") < 0 ||
        col_parse(okey, &r.okey, 0, rows, "ordering_key") < 0 || col_parse(seq, &r.seq, 8, rows, "sequence_id") < 0)
        goto done;
    if (r.props.present && !(r.names.present && r.texts.present)) {
        PyErr_SetString(PyExc_ValueError, "a properties map without its names and values");
        goto done;
    }
    if (starts.len != counts.len || starts.len % 8) {
        PyErr_SetString(PyExc_ValueError, "starts and counts must be int64 arrays of one length");
        goto done;
    }
    nbatches = starts.len / 8;
    if ((payloads = PyList_New(nbatches)) == NULL || (sizes = PyList_New(nbatches)) == NULL)
        goto done;
    for (k = 0; k < nbatches; k++) {
        int64_t first, count, i;
        Buf out = {NULL, 0, 0};
        unsigned long long size = 0;
        PyObject *payload, *total;
        memcpy(&first, (const char *)starts.buf + 8 * k, 8);
        memcpy(&count, (const char *)counts.buf + 8 * k, 8);
        if (first < 0 || count < 0 || first > rows || count > rows - first) {
            PyErr_Format(PyExc_ValueError, "batch %zd: rows %lld..+%lld outside the %zd rows", k, (long long)first,
                         (long long)count, rows);
            goto done;
        }
        /* Every member's size, its metadata and its value: the values are most of it. */
        if (buf_init(&out, r.value.present && count
                               ? 24 * (Py_ssize_t)count + (col_offset(&r.value, (Py_ssize_t)(first + count)) -
                                                           col_offset(&r.value, (Py_ssize_t)first))
                               : 24 * (Py_ssize_t)count) < 0)
            goto done;
        for (i = first; i < first + count; i++) {
            if (encode_row(&out, &r, (Py_ssize_t)i, &ps, &size) < 0) {
                Py_XDECREF(out.obj);
                goto done;
            }
        }
        if ((payload = buf_finish(&out)) == NULL)
            goto done;
        PyList_SET_ITEM(payloads, k, payload);
        if ((total = PyLong_FromUnsignedLongLong(size)) == NULL)
            goto done;
        PyList_SET_ITEM(sizes, k, total);
    }
    result = PyTuple_Pack(2, payloads, sizes);
done:
    Py_XDECREF(payloads);
    Py_XDECREF(sizes);
    PyMem_RawFree(ps.items);
    rows_release(&r);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&counts);
    return result;
}

static PyMethodDef methods[] = {
    {"check", codec_check, METH_VARARGS,
     "check(payload, count, max_members, first_sequence_id) -> sum of the members' record sizes"},
    {"decode", codec_decode, METH_VARARGS,
     "decode(ledger_id, batches, max_members) -> the rows of the batches' members, as buffers"},
    {"encode", codec_encode, METH_VARARGS,
     "encode(entries, batch_size) -> a batch payload of the entries, an empty slot where none is"},
    {"encode_rows", codec_encode_rows, METH_VARARGS,
     "encode_rows(rows, key, value, properties, names, texts, event_time, ordering_key, sequence_id, starts, "
     "counts) -> (payloads, record sizes) of batches of a table's rows, from its Arrow buffers"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "ledger._batch_codec", "The members of Pulsar batches, decoded in bulk.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__batch_codec(void)
{
    return PyModule_Create(&module);
}
