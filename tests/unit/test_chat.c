/* test_chat.c: chat-template recognition and rendering, through
 * tokenizer/chat.h, against tests/data/chat/: real templates of the models
 * (and llama.cpp's test templates) with the prompts they must render, taken
 * from llama.cpp's test-chat-template.cpp or rendered by jinja2 as Hugging
 * Face does (gen_refs.py says which, per case). Run from the repository root
 * (tests/run.sh does). */
#include "test.h"

#include "tokenizer/chat.h"

#define DATA "tests/data/chat/"

typedef struct conv {
    const char *name;
    cm_chat_msg m[8];
    size_t n;
} conv;

/* The same conversations as gen_refs.py's CONVS. */
static const conv convs[] = {
    {"std",
     {{"system", "You are a helpful assistant"},
      {"user", "Hello"},
      {"assistant", "Hi there"},
      {"user", "Who are you"},
      {"assistant", "   I am an assistant   "},
      {"user", "Another question"}},
     6},
    {"nosys",
     {{"user", "Hello"},
      {"assistant", "Hi there"},
      {"user", "Who are you"},
      {"assistant", "   I am an assistant   "},
      {"user", "Another question"}},
     5},
    {"think",
     {{"system", "Be brief."},
      {"user", "2+2?"},
      {"assistant", "<think>\nadd them\n</think>\n\n4"},
      {"user", "And 3+3?"}},
     4},
    {"utf8",
     {{"user", "Gr\xC3\xBC\xC3\x9F"
               "e, \xE4\xB8\x96\xE7\x95\x8C! \xC2\xBFQu\xC3\xA9 tal?"}},
     1},
};

static const conv *find_conv(const char *name) {
    for (size_t i = 0; i < CM_ARRAY_LEN(convs); i++)
        if (!strcmp(convs[i].name, name)) return &convs[i];
    return NULL;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) {
        b[n] = 0;
        *len = (size_t)n;
    }
    return b;
}

/* Show where two texts first differ. */
static void show_diff(const char *case_name, const char *got, size_t gl, const char *want, size_t wl) {
    size_t i = 0;
    while (i < gl && i < wl && got[i] == want[i]) i++;
    fprintf(stderr, "    %s: first difference at byte %zu (got %zu bytes, want %zu)\n", case_name, i, gl, wl);
    fprintf(stderr, "    got : %.60s\n    want: %.60s\n", got + (i > 20 ? i - 20 : 0), want + (i > 20 ? i - 20 : 0));
}

static int n_cases, n_llamacpp, n_jinja2, families_seen[CM_CHAT_FAMILY_COUNT];

static void test_cases(void) {
    size_t len;
    char *list = slurp(DATA "cases.txt", &len);
    CHECKF(list != NULL, "cannot read " DATA "cases.txt (run from the repository root)");
    if (!list) return;
    for (char *line = strtok(list, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#') continue;
        char *f[9];
        int nf = 0;
        for (char *p = line; nf < 9;) {
            f[nf++] = p;
            char *tab = strchr(p, '\t');
            if (!tab) break;
            *tab = 0;
            p = tab + 1;
        }
        CHECKF(nf == 9, "bad line in cases.txt: %s", line);
        if (nf != 9) continue;
        const char *name = f[0], *tmpl = f[1], *family = f[2], *conv_name = f[3];
        bool add_gen = f[4][0] == '1', add_bos = f[5][0] == '1';
        const char *bos = strcmp(f[6], "-") ? f[6] : "", *eos = strcmp(f[7], "-") ? f[7] : "";
        n_cases++;
        n_llamacpp += !strcmp(f[8], "llama.cpp");
        n_jinja2 += !strcmp(f[8], "jinja2");

        char path[512];
        size_t tl, wl;
        snprintf(path, sizeof path, DATA "%s.jinja", tmpl);
        char *text = slurp(path, &tl);
        snprintf(path, sizeof path, DATA "%s.out", name);
        char *want = slurp(path, &wl);
        const conv *cv = find_conv(conv_name);
        CHECKF(text && want && cv, "%s: missing data", name);
        if (!text || !want || !cv) {
            free(text);
            free(want);
            continue;
        }
        /* Recognise the family from the real template text. */
        cm_chat_template t;
        char err[512] = "";
        int rc = cm_chat_template_detect(&t, text, tl, err, sizeof err);
        CHECKF(rc == 0, "%s: %s", name, err);
        CHECKF(rc != 0 || !strcmp(cm_chat_family_name(t.family), family), "%s: detected %s, want %s", name,
               cm_chat_family_name(t.family), family);
        if (rc == 0) families_seen[t.family]++;
        /* Render and compare byte for byte. */
        cm_chat_opts o = {.add_generation_prompt = add_gen, .tokenizer_adds_bos = add_bos, .bos = bos, .eos = eos};
        cm_buf out;
        cm_buf_init(&out);
        rc = cm_chat_render(&t, cv->m, cv->n, &o, &out, err, sizeof err);
        CHECKF(rc == 0, "%s: render: %s", name, err);
        bool same = out.len == wl && !memcmp(out.data, want, wl);
        CHECKF(same, "%s (%s) renders differently", name, family);
        if (!same) show_diff(name, out.data ? out.data : "", out.len, want, wl);
        cm_buf_release(&out);
        free(text);
        free(want);
    }
    free(list);
    fprintf(stderr, "  chat cases: %d (%d from llama.cpp, %d from jinja2)\n", n_cases, n_llamacpp, n_jinja2);
    CHECK(n_cases >= 36 && n_llamacpp >= 19 && n_jinja2 >= 17);
    /* the families the issue names are all covered by a real template */
    const enum cm_chat_family must[] = {
        CM_CHAT_LLAMA2,     CM_CHAT_LLAMA3,     CM_CHAT_LLAMA31,           CM_CHAT_CHATML,     CM_CHAT_MISTRAL,
        CM_CHAT_MISTRAL_V1, CM_CHAT_MISTRAL_V3, CM_CHAT_MISTRAL_V3_TEKKEN, CM_CHAT_MISTRAL_V7, CM_CHAT_ZEPHYR,
        CM_CHAT_PHI3,       CM_CHAT_GEMMA,      CM_CHAT_DEEPSEEK,          CM_CHAT_DEEPSEEK2,  CM_CHAT_DEEPSEEK3};
    for (size_t i = 0; i < CM_ARRAY_LEN(must); i++)
        CHECKF(families_seen[must[i]] > 0, "no case for %s", cm_chat_family_name(must[i]));
}

static void test_unrecognised(void) {
    cm_chat_template t;
    char err[512];
    /* ChatGLM4 (shares <|user|>/<|assistant|> with zephyr), Orion, nonsense, nothing */
    const char *bad[] = {
        "[gMASK]<sop>{% for item in messages %}{% if item['content'] %}<|{{ item['role'] }}|>{{ item['metadata'] }}\n"
        "{{ item['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}",
        "{% for message in messages %}{% if loop.first %}{{ bos_token }}{% endif %}{% if message['role'] == 'user' %}"
        "{{ 'Human: ' + message['content'] + '\\n\\nAssistant: ' + eos_token }}{% elif message['role'] == 'assistant' %}"
        "{{ message['content'] + eos_token }}{% endif %}{% endfor %}",
        "INVALID TEMPLATE",
    };
    for (size_t i = 0; i < CM_ARRAY_LEN(bad); i++) {
        int rc = cm_chat_template_detect(&t, bad[i], strlen(bad[i]), err, sizeof err);
        CHECKF(rc == CM_EUNSUPPORTED, "template %zu was recognised as %s", i, cm_chat_family_name(t.family));
        CHECK(strstr(err, "--chat-template") && strstr(err, "chatml") && strstr(err, "deepseek3") &&
              strstr(err, "llama2"));
    }
    CHECK(cm_chat_template_detect(&t, NULL, 0, err, sizeof err) == CM_EUNSUPPORTED && strstr(err, "no chat template"));
    /* by name: every listed name works, an unknown one lists them */
    char names[1024];
    snprintf(names, sizeof names, "%s", cm_chat_template_names());
    int count = 0;
    for (char *nm = strtok(names, ", "); nm; nm = strtok(NULL, ", ")) {
        CHECKF(cm_chat_template_by_name(&t, nm, err, sizeof err) == 0, "name %s", nm);
        CHECKF(!strcmp(cm_chat_family_name(t.family), nm), "name %s gives %s", nm, cm_chat_family_name(t.family));
        count++;
    }
    CHECK(count == CM_CHAT_FAMILY_COUNT);
    CHECK(cm_chat_template_by_name(&t, "alpaca", err, sizeof err) == CM_EINVAL && strstr(err, "'alpaca'") &&
          strstr(err, "zephyr"));
    CHECK(!strcmp(cm_chat_family_name((enum cm_chat_family)99), "unknown"));
}

static void test_detect_bounds(void) {
    /* detection must not read past n: the marker straddles the end */
    char buf[32];
    memcpy(buf, "xx<|im_start|>", 14);
    cm_chat_template t;
    CHECK(cm_chat_template_detect(&t, buf, 10, NULL, 0) == CM_EUNSUPPORTED);
    CHECK(cm_chat_template_detect(&t, buf, 14, NULL, 0) == 0 && t.family == CM_CHAT_CHATML);
    /* a default system prompt that is an expression is not taken as text */
    const char *q = "{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}";
    CHECK(cm_chat_template_detect(&t, q, strlen(q), NULL, 0) == 0 && t.default_system[0] == 0);
    /* an over-long default system prompt is ignored rather than cut */
    static char longq[1024];
    int n = snprintf(longq, sizeof longq, "<|im_start|>system\\n");
    memset(longq + n, 'a', 600);
    strcpy(longq + n + 600, "<|im_end|>");
    CHECK(cm_chat_template_detect(&t, longq, strlen(longq), NULL, 0) == 0 && t.default_system[0] == 0);
}

static void render_to(const cm_chat_template *t, const cm_chat_msg *m, size_t n, const cm_chat_opts *o, cm_buf *b) {
    cm_buf_clear(b);
    char err[256] = "";
    int rc = cm_chat_render(t, m, n, o, b, err, sizeof err);
    CHECKF(rc == 0, "%s", err);
}

static void test_bos_contract(void) {
    cm_chat_template t;
    cm_buf b;
    cm_buf_init(&b);
    cm_chat_msg m[] = {{"user", "Hi"}, {"assistant", "Yo"}, {"user", "Again"}};
    cm_chat_opts o = {.add_generation_prompt = true, .tokenizer_adds_bos = true, .bos = "<s>", .eos = "</s>"};
    CHECK(cm_chat_template_by_name(&t, "llama2", NULL, 0) == 0);
    render_to(&t, m, 3, &o, &b);
    /* the leading BOS is the tokenizer's; the one inside the history stays */
    CHECK(!strcmp(b.data, "[INST] Hi [/INST] Yo </s><s>[INST] Again [/INST]"));
    o.tokenizer_adds_bos = false;
    render_to(&t, m, 3, &o, &b);
    CHECK(!strcmp(b.data, "<s>[INST] Hi [/INST] Yo </s><s>[INST] Again [/INST]"));
    CHECK(cm_chat_template_by_name(&t, "llama3", NULL, 0) == 0);
    o.bos = "<|begin_of_text|>";
    render_to(&t, m, 1, &o, &b);
    CHECK(!strncmp(b.data, "<|begin_of_text|><|start_header_id|>user", 40));
    o.tokenizer_adds_bos = true;
    render_to(&t, m, 1, &o, &b);
    CHECK(!strcmp(b.data, "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                          "<|start_header_id|>assistant<|end_header_id|>\n\n"));
    /* rendering appends: earlier buffer content is kept and not mistaken for the start */
    cm_buf_clear(&b);
    cm_buf_puts(&b, "PREFIX");
    CHECK(cm_chat_render(&t, m, 1, &o, &b, NULL, 0) == 0 && !strncmp(b.data, "PREFIX<|start_header_id|>", 25));
    cm_buf_release(&b);
}

static void test_roles_and_edges(void) {
    cm_chat_template t;
    cm_buf b;
    cm_buf_init(&b);
    char err[256];
    cm_chat_opts o = {.add_generation_prompt = true};
    CHECK(cm_chat_template_by_name(&t, "chatml", NULL, 0) == 0);
    cm_chat_msg tool[] = {{"tool", "42"}};
    CHECK(cm_chat_render(&t, tool, 1, &o, &b, err, sizeof err) == CM_EINVAL && strstr(err, "'tool'"));
    cm_chat_msg nul[] = {{NULL, "x"}};
    CHECK(cm_chat_render(&t, nul, 1, &o, &b, err, sizeof err) == CM_EINVAL);
    /* empty conversation: just the generation prompt */
    cm_buf_clear(&b);
    CHECK(cm_chat_render(&t, NULL, 0, &o, &b, NULL, 0) == 0 && !strcmp(b.data, "<|im_start|>assistant\n"));
    /* a later system message is refused where the template takes it only first */
    CHECK(cm_chat_template_by_name(&t, "gemma", NULL, 0) == 0);
    cm_chat_msg late[] = {{"user", "a"}, {"system", "b"}};
    CHECK(cm_chat_render(&t, late, 2, &o, &b, err, sizeof err) == CM_EINVAL && strstr(err, "gemma"));
    /* ... and rendered in place where the template loops over roles */
    CHECK(cm_chat_template_by_name(&t, "chatml", NULL, 0) == 0);
    cm_buf_clear(&b);
    CHECK(cm_chat_render(&t, late, 2, &o, &b, NULL, 0) == 0 &&
          !strcmp(b.data, "<|im_start|>user\na<|im_end|>\n<|im_start|>system\nb<|im_end|>\n<|im_start|>assistant\n"));
    /* deepseek3 by name opens the reply with <think> (R1); the last </think> wins */
    CHECK(cm_chat_template_by_name(&t, "deepseek3", NULL, 0) == 0 && t.think);
    cm_chat_msg r1[] = {{"assistant", "<think>a</think>b</think>c"}};
    o.add_generation_prompt = false;
    cm_buf_clear(&b);
    CHECK(cm_chat_render(&t, r1, 1, &o, &b, NULL, 0) == 0 &&
          !strcmp(b.data, "<\xEF\xBD\x9C"
                          "Assistant\xEF\xBD\x9C>c<\xEF\xBD\x9C"
                          "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"));
    /* llama3.1: the date can be set */
    CHECK(cm_chat_template_by_name(&t, "llama3.1", NULL, 0) == 0);
    cm_chat_opts od = {.tokenizer_adds_bos = true, .date = "02 Dec 2026"};
    cm_buf_clear(&b);
    CHECK(cm_chat_render(&t, NULL, 0, &od, &b, NULL, 0) == 0 &&
          strstr(b.data, "Today Date: 02 Dec 2026\n\n<|eot_id|>"));
    cm_buf_release(&b);
}

/* gpt-oss (harmony): llama.cpp's llm_chat_apply_template writes each role
 * verbatim between <|start|> and <|message|>, ends a past assistant turn with
 * <|return|> and every other with <|end|>, and prompts "<|start|>assistant".
 * The template text is detected by <|start|> + <|channel|> (an excerpt of
 * the released gpt-oss template, which also holds phi3's <|end|>). */
static void test_gpt_oss(void) {
    static const char tmpl[] =
        "{{- \"<|start|>system<|message|>\" }}{%- if message.role == 'assistant' %}"
        "{{- \"<|start|>assistant<|channel|>final<|message|>\" + message.content + \"<|end|>\" }}"
        "{{- \"<|start|>user<|message|>\" }}{{ bos_token }}";
    cm_chat_template t;
    char err[256] = "";
    CHECK(cm_chat_template_detect(&t, tmpl, sizeof tmpl - 1, err, sizeof err) == 0 && t.family == CM_CHAT_GPT_OSS);
    CHECK(!t.lead_bos);
    CHECK(!strcmp(cm_chat_family_name(t.family), "gpt-oss"));
    cm_buf b;
    cm_buf_init(&b);
    cm_chat_msg m[] = {{"system", "Be brief."},
                       {"developer", "Answer in French."},
                       {"user", "Hi"},
                       {"assistant", "Salut"},
                       {"user", "Again"}};
    cm_chat_opts o = {.add_generation_prompt = true, .bos = "<|startoftext|>"};
    render_to(&t, m, 5, &o, &b);
    CHECKF(!strcmp(b.data, "<|start|>system<|message|>Be brief.<|end|>"
                           "<|start|>developer<|message|>Answer in French.<|end|>"
                           "<|start|>user<|message|>Hi<|end|>"
                           "<|start|>assistant<|message|>Salut<|return|>"
                           "<|start|>user<|message|>Again<|end|>"
                           "<|start|>assistant"),
           "got %s", b.data);
    o.add_generation_prompt = false;
    render_to(&t, m + 2, 1, &o, &b);
    CHECK(!strcmp(b.data, "<|start|>user<|message|>Hi<|end|>"));
    /* "developer" is a role of this family only */
    cm_chat_template c;
    CHECK(cm_chat_template_by_name(&c, "chatml", NULL, 0) == 0);
    cm_buf_clear(&b);
    CHECK(cm_chat_render(&c, m + 1, 1, &o, &b, err, sizeof err) == CM_EINVAL && strstr(err, "developer"));
    cm_buf_release(&b);
}

/* The final-channel filter, fed in pieces of every size from 1 byte up. */
static void harmony_case(const char *reply, const char *want) {
    const size_t n = strlen(reply);
    for (size_t step = 1; step <= n; step += step < 8 ? 1 : 7) {
        cm_harmony h;
        cm_harmony_init(&h);
        cm_buf b;
        cm_buf_init(&b);
        for (size_t i = 0; i < n; i += step) cm_harmony_feed(&h, reply + i, step < n - i ? step : n - i, &b);
        cm_harmony_flush(&h, &b);
        cm_buf_append(&b, "", 1);
        CHECKF(!strcmp(b.data, want), "reply '%s' in pieces of %zu gave '%s', want '%s'", reply, step, b.data, want);
        cm_buf_release(&b);
        if (n == 0) break;
    }
}

static void test_harmony_filter(void) {
    harmony_case("<|channel|>analysis<|message|>User says hi. Reply.<|end|>"
                 "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?",
                 "Hello! How can I help?");
    /* only the final channel, however many come before; marker look-alikes stay */
    harmony_case(
        "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary to=fn<|message|>{}<|end|>"
        "<|start|>assistant<|channel|>final<|message|>x <|en y <|end z<|end|>",
        "x <|en y <|end z");
    harmony_case("<|channel|>final <|constrain|>json<|message|>{\"a\":1}", "{\"a\":1}");
    harmony_case("<|channel|>analysis<|message|>thinking, cut off by max_tokens", "");
    harmony_case("<|channel|>analy", "");
    /* not a harmony reply (a model that ignores the format): unchanged */
    harmony_case("Plain text <|end|> and more", "Plain text <|end|> and more");
    harmony_case("<|chat", "<|chat");
    harmony_case("", "");
    /* a header longer than the buffer: passed through whole */
    char longh[400];
    memset(longh, 'x', sizeof longh);
    memcpy(longh, "<|channel|>", 11);
    longh[sizeof longh - 1] = 0;
    harmony_case(longh, longh);
}

int main(void) {
    RUN(test_cases);
    RUN(test_unrecognised);
    RUN(test_detect_bounds);
    RUN(test_bos_contract);
    RUN(test_roles_and_edges);
    RUN(test_gpt_oss);
    RUN(test_harmony_filter);
    TEST_END();
}
