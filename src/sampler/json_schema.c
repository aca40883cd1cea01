/*
 * json_schema.c: JSON Schema -> byte grammar (grammar.h), for OpenAI's
 * response_format (json_schema, json_object) and tool-call arguments.
 *
 * Every text the grammar accepts is valid JSON that satisfies the schema;
 * the converse is not promised: objects get their listed properties in the
 * listed order (required ones always, optional ones may be left out), no
 * others (additionalProperties true is read as "allowed", not "produced");
 * whitespace between tokens is one space or a newline and up to 16 spaces, numbers at most 16 integer
 * digits, 16 fraction digits and 3 exponent digits (a model cannot ramble
 * forever inside them). A keyword that would need more than that to be
 * enforced (pattern, format, minimum, allOf, ...) is refused with a message
 * naming it and where it is; annotations (title, description, default,
 * examples, ...) are ignored.
 *
 * Supported: type (one or a list), enum, const, anyOf/oneOf, $ref to
 * "#", "#/$defs/..." or "#/definitions/..." (recursion allowed), properties
 * + required, additionalProperties false/true, or a schema when there are
 * no properties (a map), items, minItems/maxItems, minLength/maxLength,
 * nullable. Reads cJSON trees (untrusted: every shape is checked).
 */
#include "grammar.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define MAX_REFS 128
#define MAX_NEST 64
#define MAX_REPEAT 1000

typedef struct jsc {
    cm_grammar *g;
    const cJSON *doc;
    char *err;
    size_t errlen;
    int rc;
    int r_ws, r_value, r_string, r_number, r_integer, r_char;
    struct {
        const cJSON *node;
        int rule;
    } refs[MAX_REFS];
    int n_refs, depth;
} jsc;

static int fail(jsc *c, int code, const char *path, const char *fmt, const char *arg) {
    if (!c->rc) {
        char m[256];
        snprintf(m, sizeof m, fmt, arg);
        c->rc = cm_errf(c->err, c->errlen, code, "%s%s%s", m, *path ? " at " : "", path);
    }
    return -1;
}

static int rule(jsc *c) {
    int r = cm_grammar_rule(c->g);
    if (r < 0 && !c->rc) c->rc = cm_errf(c->err, c->errlen, CM_ENOMEM, "out of memory building the grammar");
    return r;
}

/* x{min,max} (max < 0: unbounded) as a new rule. */
static int rep(jsc *c, int x, int min, int max) {
    int tail = rule(c);
    if (tail < 0) return -1;
    if (max < 0) { /* tail ::= "" | x tail */
        cm_grammar_alt(c->g, tail);
        cm_grammar_ref(c->g, tail, x);
        cm_grammar_ref(c->g, tail, tail);
    } else { /* t_k ::= "" | x t_{k-1}, k = max - min optional copies */
        for (int k = 0; k < max - min; k++) {
            int t = rule(c);
            if (t < 0) return -1;
            cm_grammar_alt(c->g, t);
            cm_grammar_ref(c->g, t, x);
            cm_grammar_ref(c->g, t, tail);
            tail = t;
        }
    }
    if (!min) return tail;
    int r = rule(c);
    if (r < 0) return -1;
    for (int i = 0; i < min; i++) cm_grammar_ref(c->g, r, x);
    cm_grammar_ref(c->g, r, tail);
    return r;
}

/* ws ::= "" | " " | "\n" " "{0,16}: room for compact and indented JSON,
 * none for a model to wander (no runs of blank lines). */
static int ws(jsc *c) {
    if (c->r_ws >= 0) return c->r_ws;
    int sp = rule(c), r = rule(c);
    if (sp < 0 || r < 0) return -1;
    cm_grammar_lit(c->g, sp, " ");
    int ind = rep(c, sp, 0, 16);
    if (ind < 0) return -1;
    cm_grammar_alt(c->g, r);
    cm_grammar_lit(c->g, r, " ");
    cm_grammar_alt(c->g, r);
    cm_grammar_lit(c->g, r, "\n");
    cm_grammar_ref(c->g, r, ind);
    return c->r_ws = r;
}

static int str_char(jsc *c) {
    if (c->r_char >= 0) return c->r_char;
    int r = rule(c), hex = rule(c);
    if (r < 0 || hex < 0) return -1;
    cm_grammar_range(c->g, hex, '0', '9');
    cm_grammar_alt(c->g, hex);
    cm_grammar_range(c->g, hex, 'a', 'f');
    cm_grammar_alt(c->g, hex);
    cm_grammar_range(c->g, hex, 'A', 'F');
    uint64_t plain[4] = {0};
    for (unsigned b = 0x20; b < 0x80; b++)
        if (b != '"' && b != '\\') plain[b >> 6] |= 1ull << (b & 63);
    cm_grammar_set(c->g, r, plain);
    /* whole UTF-8 sequences only (no overlongs, no surrogates) */
    cm_grammar_alt(c->g, r);
    cm_grammar_range(c->g, r, 0xC2, 0xDF), cm_grammar_range(c->g, r, 0x80, 0xBF);
    cm_grammar_alt(c->g, r);
    cm_grammar_range(c->g, r, 0xE0, 0xE0), cm_grammar_range(c->g, r, 0xA0, 0xBF), cm_grammar_range(c->g, r, 0x80, 0xBF);
    cm_grammar_alt(c->g, r);
    cm_grammar_range(c->g, r, 0xE1, 0xEC), cm_grammar_range(c->g, r, 0x80, 0xBF), cm_grammar_range(c->g, r, 0x80, 0xBF);
    cm_grammar_alt(c->g, r);
    cm_grammar_range(c->g, r, 0xED, 0xED), cm_grammar_range(c->g, r, 0x80, 0x9F), cm_grammar_range(c->g, r, 0x80, 0xBF);
    cm_grammar_alt(c->g, r);
    cm_grammar_range(c->g, r, 0xEE, 0xEF), cm_grammar_range(c->g, r, 0x80, 0xBF), cm_grammar_range(c->g, r, 0x80, 0xBF);
    cm_grammar_alt(c->g, r);
    cm_grammar_range(c->g, r, 0xF0, 0xF0), cm_grammar_range(c->g, r, 0x90, 0xBF);
    cm_grammar_range(c->g, r, 0x80, 0xBF), cm_grammar_range(c->g, r, 0x80, 0xBF);
    cm_grammar_alt(c->g, r);
    cm_grammar_range(c->g, r, 0xF1, 0xF3), cm_grammar_range(c->g, r, 0x80, 0xBF);
    cm_grammar_range(c->g, r, 0x80, 0xBF), cm_grammar_range(c->g, r, 0x80, 0xBF);
    cm_grammar_alt(c->g, r);
    cm_grammar_range(c->g, r, 0xF4, 0xF4), cm_grammar_range(c->g, r, 0x80, 0x8F);
    cm_grammar_range(c->g, r, 0x80, 0xBF), cm_grammar_range(c->g, r, 0x80, 0xBF);
    cm_grammar_alt(c->g, r);
    cm_grammar_lit(c->g, r, "\\");
    uint64_t esc[4] = {0};
    for (const char *p = "\"\\/bfnrt"; *p; p++) esc[(unsigned char)*p >> 6] |= 1ull << (*p & 63);
    cm_grammar_set(c->g, r, esc);
    cm_grammar_alt(c->g, r);
    /* \uHHHH outside the surrogates (a lone surrogate is not a character;
     * strict parsers refuse it): [0-9a-cA-Ce-fE-F]HHH | [dD][0-7]HH (H: a hex digit) */
    uint64_t h1[4] = {0};
    for (const char *p = "0123456789abcefABCEF"; *p; p++) h1[(unsigned char)*p >> 6] |= 1ull << (*p & 63);
    cm_grammar_lit(c->g, r, "\\u");
    cm_grammar_set(c->g, r, h1);
    for (int i = 0; i < 3; i++) cm_grammar_ref(c->g, r, hex);
    cm_grammar_alt(c->g, r);
    cm_grammar_lit(c->g, r, "\\u");
    uint64_t dd[4] = {0};
    dd[(unsigned char)'d' >> 6] |= 1ull << ('d' & 63);
    dd[(unsigned char)'D' >> 6] |= 1ull << ('D' & 63);
    cm_grammar_set(c->g, r, dd);
    cm_grammar_range(c->g, r, '0', '7');
    cm_grammar_ref(c->g, r, hex);
    cm_grammar_ref(c->g, r, hex);
    return c->r_char = r;
}

static int string_rule(jsc *c, int min, int max) {
    if (min == 0 && max < 0 && c->r_string >= 0) return c->r_string;
    int ch = str_char(c), body = ch >= 0 ? rep(c, ch, min, max) : -1, r = rule(c);
    if (body < 0 || r < 0) return -1;
    cm_grammar_lit(c->g, r, "\"");
    cm_grammar_ref(c->g, r, body);
    cm_grammar_lit(c->g, r, "\"");
    if (min == 0 && max < 0) c->r_string = r;
    return r;
}

static int number_rule(jsc *c, bool integer) {
    int *cache = integer ? &c->r_integer : &c->r_number;
    if (*cache >= 0) return *cache;
    int dig = rule(c), minus = rule(c), ip = rule(c);
    if (dig < 0 || minus < 0 || ip < 0) return -1;
    cm_grammar_range(c->g, dig, '0', '9');
    cm_grammar_alt(c->g, minus); /* "" | "-" */
    cm_grammar_lit(c->g, minus, "-");
    int d15 = rep(c, dig, 0, 15);
    if (d15 < 0) return -1;
    cm_grammar_lit(c->g, ip, "0");
    cm_grammar_alt(c->g, ip);
    cm_grammar_range(c->g, ip, '1', '9');
    cm_grammar_ref(c->g, ip, d15);
    int r = rule(c);
    if (r < 0) return -1;
    cm_grammar_ref(c->g, r, minus);
    cm_grammar_ref(c->g, r, ip);
    if (!integer) {
        int frac = rule(c), ex = rule(c), sign = rule(c), d16 = rep(c, dig, 1, 16), d3 = rep(c, dig, 1, 3);
        if (frac < 0 || ex < 0 || sign < 0 || d16 < 0 || d3 < 0) return -1;
        cm_grammar_alt(c->g, frac); /* "" | "." d{1,16} */
        cm_grammar_lit(c->g, frac, ".");
        cm_grammar_ref(c->g, frac, d16);
        cm_grammar_alt(c->g, sign);
        cm_grammar_lit(c->g, sign, "-");
        cm_grammar_alt(c->g, sign);
        cm_grammar_lit(c->g, sign, "+");
        cm_grammar_alt(c->g, ex); /* "" | [eE] sign d{1,3} */
        cm_grammar_range(c->g, ex, 'e', 'e');
        cm_grammar_ref(c->g, ex, sign);
        cm_grammar_ref(c->g, ex, d3);
        cm_grammar_alt(c->g, ex);
        cm_grammar_range(c->g, ex, 'E', 'E');
        cm_grammar_ref(c->g, ex, sign);
        cm_grammar_ref(c->g, ex, d3);
        cm_grammar_ref(c->g, r, frac);
        cm_grammar_ref(c->g, r, ex);
    }
    return *cache = r;
}

/* open ws close | open ws item (ws "," ws item){min-1,max-1} ws close
 * (the empty form only when min is 0): a JSON array ("[" "]") of items, or
 * an object ("{" "}") whose items are its members. */
static int list_of(jsc *c, const char *open, int item, const char *close, int min, int max) {
    int w = ws(c), more = rule(c), r = rule(c);
    if (w < 0 || more < 0 || r < 0) return -1;
    cm_grammar_ref(c->g, more, w);
    cm_grammar_lit(c->g, more, ",");
    cm_grammar_ref(c->g, more, w);
    cm_grammar_ref(c->g, more, item);
    int tail = rep(c, more, min > 0 ? min - 1 : 0, max < 0 ? -1 : max - 1);
    if (tail < 0) return -1;
    if (min == 0) {
        cm_grammar_lit(c->g, r, open);
        cm_grammar_ref(c->g, r, w);
        cm_grammar_lit(c->g, r, close);
        if (max == 0) return r;
        cm_grammar_alt(c->g, r);
    }
    cm_grammar_lit(c->g, r, open);
    cm_grammar_ref(c->g, r, w);
    cm_grammar_ref(c->g, r, item);
    cm_grammar_ref(c->g, r, tail);
    cm_grammar_ref(c->g, r, w);
    cm_grammar_lit(c->g, r, close);
    return r;
}

/* An object whose members are key (a string rule) : value, any number. */
static int map_of(jsc *c, int key, int val) {
    int w = ws(c), mem = rule(c);
    if (w < 0 || mem < 0) return -1;
    cm_grammar_ref(c->g, mem, key);
    cm_grammar_ref(c->g, mem, w);
    cm_grammar_lit(c->g, mem, ":");
    cm_grammar_ref(c->g, mem, w);
    cm_grammar_ref(c->g, mem, val);
    return list_of(c, "{", mem, "}", 0, -1);
}

static int any_value(jsc *c) {
    if (c->r_value >= 0) return c->r_value;
    int r = c->r_value = rule(c);
    if (r < 0) return -1;
    int obj = map_of(c, string_rule(c, 0, -1), r), arr = list_of(c, "[", r, "]", 0, -1);
    int str = string_rule(c, 0, -1), num = number_rule(c, false);
    if (obj < 0 || arr < 0 || str < 0 || num < 0) return -1;
    cm_grammar_ref(c->g, r, obj);
    cm_grammar_alt(c->g, r);
    cm_grammar_ref(c->g, r, arr);
    cm_grammar_alt(c->g, r);
    cm_grammar_ref(c->g, r, str);
    cm_grammar_alt(c->g, r);
    cm_grammar_ref(c->g, r, num);
    const char *lits[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        cm_grammar_alt(c->g, r);
        cm_grammar_lit(c->g, r, lits[i]);
    }
    return r;
}

/* The compact JSON text of x as a literal rule. */
static int literal(jsc *c, const cJSON *x) {
    char *t = cJSON_PrintUnformatted(x);
    int r = rule(c);
    if (!t || r < 0) {
        cJSON_free(t);
        return -1;
    }
    cm_grammar_lit(c->g, r, t);
    cJSON_free(t);
    return r;
}

static int compile(jsc *c, const cJSON *s, const char *path);

static int int_kw(jsc *c, const cJSON *s, const char *kw, int dflt, const char *path) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(s, kw);
    if (!x) return dflt;
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > MAX_REPEAT ||
        x->valuedouble != floor(x->valuedouble))
        return fail(c, CM_EINVAL, path, "'%s' must be an integer from 0 to 1000", kw), -2;
    return (int)x->valuedouble;
}

static int object_rule(jsc *c, const cJSON *s, const char *path) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    char sub[512];
    if (props && !cJSON_IsObject(props)) return fail(c, CM_EINVAL, path, "'%s' must be an object", "properties");
    if (req && !cJSON_IsArray(req)) return fail(c, CM_EINVAL, path, "'%s' must be an array of names", "required");
    int n = props ? cJSON_GetArraySize(props) : 0;
    if (n == 0) {
        if (add && !cJSON_IsBool(add)) { /* a map: string keys, values of that schema */
            snprintf(sub, sizeof sub, "%s/additionalProperties", path);
            int v = compile(c, add, sub);
            return v < 0 ? -1 : map_of(c, string_rule(c, 0, -1), v);
        }
        if (cJSON_IsFalse(add)) { /* {} only */
            int r = rule(c), w = ws(c);
            if (r < 0 || w < 0) return -1;
            cm_grammar_lit(c->g, r, "{");
            cm_grammar_ref(c->g, r, w);
            cm_grammar_lit(c->g, r, "}");
            return r;
        }
        return map_of(c, string_rule(c, 0, -1), any_value(c));
    }
    if (add && !cJSON_IsBool(add))
        return fail(c, CM_EINVAL, path, "'%s' as a schema beside 'properties' is not supported",
                    "additionalProperties");
    const cJSON *x;
    cJSON_ArrayForEach(x, req) {
        if (!cJSON_IsString(x)) return fail(c, CM_EINVAL, path, "'%s' must be an array of names", "required");
        if (!cJSON_GetObjectItemCaseSensitive(props, x->valuestring))
            return fail(c, CM_EINVAL, path, "required property '%.200s' is not in 'properties'", x->valuestring);
    }
    /* kv_i ::= "name" ws ":" ws value_i; after_i (a member was written):
     * after_n ::= ""; after_i ::= ws "," ws kv_i after_{i+1} | (optional) after_{i+1}
     * first_i (none yet): first_n ::= ""; first_i ::= kv_i after_{i+1} | (optional) first_{i+1} */
    int w = ws(c);
    if (w < 0) return -1;
    int *kv = cm_calloc((size_t)n * 3 + 3, sizeof *kv);
    if (!kv) return fail(c, CM_ENOMEM, "", "%s", "out of memory");
    int *after = kv + n, *first = kv + 2 * n + 1;
    bool *opt = cm_calloc((size_t)n, sizeof *opt);
    int i = 0, rc = 0;
    if (!opt) {
        cm_free(kv);
        return fail(c, CM_ENOMEM, "", "%s", "out of memory");
    }
    cJSON_ArrayForEach(x, props) {
        snprintf(sub, sizeof sub, "%s/properties/%.200s", path, x->string);
        int v = compile(c, x, sub);
        kv[i] = rule(c);
        if (v < 0 || kv[i] < 0) {
            rc = -1;
            break;
        }
        cJSON *name = cJSON_CreateString(x->string);
        char *q = name ? cJSON_PrintUnformatted(name) : NULL;
        cJSON_Delete(name);
        if (!q) {
            rc = fail(c, CM_ENOMEM, "", "%s", "out of memory");
            break;
        }
        cm_grammar_lit(c->g, kv[i], q);
        cJSON_free(q);
        cm_grammar_ref(c->g, kv[i], w);
        cm_grammar_lit(c->g, kv[i], ":");
        cm_grammar_ref(c->g, kv[i], w);
        cm_grammar_ref(c->g, kv[i], v);
        opt[i] = true;
        cJSON_ArrayForEach(name, req) if (cJSON_IsString(name) && !strcmp(name->valuestring, x->string)) opt[i] = false;
        i++;
    }
    if (!rc) {
        after[n] = rule(c);
        first[n] = rule(c);
        for (i = n - 1; i >= 0 && after[n] >= 0 && first[n] >= 0; i--) {
            after[i] = rule(c);
            first[i] = rule(c);
            if (after[i] < 0 || first[i] < 0) break;
            cm_grammar_ref(c->g, after[i], w);
            cm_grammar_lit(c->g, after[i], ",");
            cm_grammar_ref(c->g, after[i], w);
            cm_grammar_ref(c->g, after[i], kv[i]);
            cm_grammar_ref(c->g, after[i], after[i + 1]);
            cm_grammar_ref(c->g, first[i], kv[i]);
            cm_grammar_ref(c->g, first[i], after[i + 1]);
            if (opt[i]) {
                cm_grammar_alt(c->g, after[i]);
                cm_grammar_ref(c->g, after[i], after[i + 1]);
                cm_grammar_alt(c->g, first[i]);
                cm_grammar_ref(c->g, first[i], first[i + 1]);
            }
        }
        int r = rule(c);
        if (r >= 0 && !c->rc) {
            cm_grammar_lit(c->g, r, "{");
            cm_grammar_ref(c->g, r, w);
            cm_grammar_ref(c->g, r, first[0]);
            cm_grammar_ref(c->g, r, w);
            cm_grammar_lit(c->g, r, "}");
            rc = r;
        } else {
            rc = -1;
        }
    }
    cm_free(opt);
    cm_free(kv);
    return rc;
}

static int typed(jsc *c, const cJSON *s, const char *t, const char *path) {
    char sub[512];
    if (!strcmp(t, "string")) {
        int mn = int_kw(c, s, "minLength", 0, path), mx = int_kw(c, s, "maxLength", -1, path);
        if (mn < -1 || mx < -1) return -1;
        if (mx >= 0 && mx < mn) return fail(c, CM_EINVAL, path, "'%s' is below minLength", "maxLength");
        return string_rule(c, mn, mx);
    }
    if (!strcmp(t, "number")) return number_rule(c, false);
    if (!strcmp(t, "integer")) return number_rule(c, true);
    if (!strcmp(t, "boolean") || !strcmp(t, "null")) {
        int r = rule(c);
        if (r < 0) return -1;
        cm_grammar_lit(c->g, r, t[0] == 'b' ? "true" : "null");
        if (t[0] == 'b') {
            cm_grammar_alt(c->g, r);
            cm_grammar_lit(c->g, r, "false");
        }
        return r;
    }
    if (!strcmp(t, "array")) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(s, "items");
        int mn = int_kw(c, s, "minItems", 0, path), mx = int_kw(c, s, "maxItems", -1, path);
        if (mn < -1 || mx < -1) return -1;
        if (mx >= 0 && mx < mn) return fail(c, CM_EINVAL, path, "'%s' is below minItems", "maxItems");
        snprintf(sub, sizeof sub, "%s/items", path);
        int item = it ? compile(c, it, sub) : any_value(c);
        return item < 0 ? -1 : list_of(c, "[", item, "]", mn, mx);
    }
    if (!strcmp(t, "object")) return object_rule(c, s, path);
    return fail(c, CM_EINVAL, path, "unknown type '%.100s'", t);
}

// clang-format off
static const char *const k_ignored[] = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                        "readOnly", "writeOnly", "deprecated", "$defs", "definitions", "strict",
                                        "type", "properties", "required", "additionalProperties", "items", "enum",
                                        "const", "anyOf", "oneOf", "$ref", "minItems", "maxItems", "minLength",
                                        "maxLength", "nullable"};
// clang-format on

static int compile_inner(jsc *c, const cJSON *s, const char *path) {
    char sub[512];
    if (cJSON_IsTrue(s)) return any_value(c);
    if (!cJSON_IsObject(s)) return fail(c, CM_EINVAL, path, "%s", "a schema must be an object or true");
    const cJSON *k;
    cJSON_ArrayForEach(k, s) {
        bool known = false;
        for (size_t i = 0; i < CM_ARRAY_LEN(k_ignored) && !known; i++) known = !strcmp(k->string, k_ignored[i]);
        if (!known) return fail(c, CM_EINVAL, path, "unsupported JSON Schema keyword '%.100s'", k->string);
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (ref) {
        if (!cJSON_IsString(ref)) return fail(c, CM_EINVAL, path, "%s", "'$ref' must be a string");
        const char *p = ref->valuestring;
        const cJSON *target = NULL;
        if (!strcmp(p, "#")) target = c->doc;
        else if (!strncmp(p, "#/$defs/", 8) || !strncmp(p, "#/definitions/", 14)) {
            const char *name = strchr(p + 2, '/') + 1;
            const cJSON *defs = cJSON_GetObjectItemCaseSensitive(c->doc, p[2] == '$' ? "$defs" : "definitions");
            target = cJSON_GetObjectItemCaseSensitive(defs, name);
        }
        if (!target)
            return fail(c, CM_EINVAL, path,
                        "unsupported or unknown '$ref' '%.200s' (only #, #/$defs/NAME, #/definitions/NAME)", p);
        for (int i = 0; i < c->n_refs; i++)
            if (c->refs[i].node == target) return c->refs[i].rule;
        if (c->n_refs == MAX_REFS) return fail(c, CM_EINVAL, path, "%s", "too many '$ref' targets");
        int r = rule(c);
        if (r < 0) return -1;
        c->refs[c->n_refs].node = target;
        c->refs[c->n_refs++].rule = r;
        int t = compile(c, target, p);
        if (t < 0) return -1;
        cm_grammar_ref(c->g, r, t);
        return r;
    }
    const cJSON *cst = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (cst) return literal(c, cst);
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    if (en) {
        if (!cJSON_IsArray(en) || cJSON_GetArraySize(en) < 1)
            return fail(c, CM_EINVAL, path, "%s", "'enum' must be a non-empty array");
        int r = rule(c), i = 0;
        if (r < 0) return -1;
        const cJSON *x;
        cJSON_ArrayForEach(x, en) {
            int l = literal(c, x);
            if (l < 0) return -1;
            if (i++) cm_grammar_alt(c->g, r);
            cm_grammar_ref(c->g, r, l);
        }
        return r;
    }
    const char *alts[2] = {"anyOf", "oneOf"};
    for (int a = 0; a < 2; a++) {
        const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, alts[a]);
        if (!any) continue;
        if (!cJSON_IsArray(any) || cJSON_GetArraySize(any) < 1)
            return fail(c, CM_EINVAL, path, "'%s' must be a non-empty array", alts[a]);
        int r = rule(c), i = 0;
        if (r < 0) return -1;
        const cJSON *x;
        cJSON_ArrayForEach(x, any) {
            snprintf(sub, sizeof sub, "%s/%s/%d", path, alts[a], i);
            int v = compile(c, x, sub);
            if (v < 0) return -1;
            if (i++) cm_grammar_alt(c->g, r);
            cm_grammar_ref(c->g, r, v);
        }
        return r;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    int r;
    if (cJSON_IsString(type)) {
        r = typed(c, s, type->valuestring, path);
    } else if (cJSON_IsArray(type) && cJSON_GetArraySize(type) > 0) {
        r = rule(c);
        int i = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, type) {
            if (!cJSON_IsString(x))
                return fail(c, CM_EINVAL, path, "%s", "'type' must be a string or an array of strings");
            int v = typed(c, s, x->valuestring, path);
            if (v < 0 || r < 0) return -1;
            if (i++) cm_grammar_alt(c->g, r);
            cm_grammar_ref(c->g, r, v);
        }
    } else if (type) {
        return fail(c, CM_EINVAL, path, "%s", "'type' must be a string or an array of strings");
    } else if (cJSON_GetObjectItemCaseSensitive(s, "properties") ||
               cJSON_GetObjectItemCaseSensitive(s, "additionalProperties")) {
        r = typed(c, s, "object", path);
    } else if (cJSON_GetObjectItemCaseSensitive(s, "items")) {
        r = typed(c, s, "array", path);
    } else {
        r = any_value(c);
    }
    if (r >= 0 && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "nullable"))) {
        int n = rule(c);
        if (n < 0) return -1;
        cm_grammar_ref(c->g, n, r);
        cm_grammar_alt(c->g, n);
        cm_grammar_lit(c->g, n, "null");
        r = n;
    }
    return r;
}

static int compile(jsc *c, const cJSON *s, const char *path) {
    if (c->rc) return -1;
    if (++c->depth > MAX_NEST) return fail(c, CM_EINVAL, path, "%s", "the schema is nested too deeply");
    int r = compile_inner(c, s, path);
    c->depth--;
    return r < 0 || c->rc ? -1 : r;
}

int cm_json_schema_rule(cm_grammar *g, const void *schema, const void *doc, char *err, size_t errlen) {
    jsc c = {.g = g,
             .doc = doc ? doc : schema,
             .err = err,
             .errlen = errlen,
             .r_ws = -1,
             .r_value = -1,
             .r_string = -1,
             .r_number = -1,
             .r_integer = -1,
             .r_char = -1};
    int r = schema ? compile(&c, schema, "") : -1;
    if (!schema) { /* json_object: any object */
        const cJSON obj = {.type = cJSON_Object};
        r = object_rule(&c, &obj, "");
    }
    if (c.rc) return c.rc;
    return r < 0 ? cm_errf(err, errlen, CM_ENOMEM, "out of memory building the grammar") : r;
}

int cm_json_ws_rule(cm_grammar *g) {
    jsc c = {.g = g, .r_ws = -1};
    return ws(&c);
}

int cm_json_grammar(const void *schema, cm_grammar **out, char *err, size_t errlen) {
    *out = NULL;
    cm_grammar *g = cm_grammar_new();
    if (!g) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    int v = cm_json_schema_rule(g, schema, NULL, err, errlen);
    int w = v >= 0 ? cm_json_ws_rule(g) : -1, root = w >= 0 ? cm_grammar_rule(g) : -1;
    if (v < 0 || w < 0 || root < 0) {
        cm_grammar_free(g);
        return v < 0 ? v : cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    }
    cm_grammar_ref(g, root, w);
    cm_grammar_ref(g, root, v);
    cm_grammar_ref(g, root, w);
    int rc = cm_grammar_finish(g, root, err, errlen);
    if (rc) {
        cm_grammar_free(g);
        return rc;
    }
    *out = g;
    return 0;
}
