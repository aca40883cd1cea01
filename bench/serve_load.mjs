#!/usr/bin/env node
// serve_load.mjs: a load generator for OpenAI-compatible servers (`cumulo serve`, llama.cpp's
// llama-server). It sends streaming /v1/completions requests whose prompts are token-id arrays
// (exact lengths, no tokenizer in the way), greedy, with ignore_eos so that every request
// generates exactly --gen tokens, and reports aggregate generated tokens/s, time to first token
// (TTFT) and inter-token latency (ITL, the gaps between streamed chunks) as p50/p99.
//
// Loads:
//   closed loop:  --users N [--requests R]   N users, each sends R requests back to back
//   open loop:    --rate L --duration S       Poisson arrivals at L requests/s for S seconds
//   probe:        --users N --long-prompt P --probes K
//                 N users decode long requests; once they all stream, one request with a
//                 P-token prompt arrives, and K short probe requests (one at a time) measure
//                 TTFT while it is admitted. Run with --users 0 for the idle-server baseline.
// Prompts are seeded random ids in [100, 30000) (--seed), different per request unless
// --shared-prefix T makes the first T ids of every prompt equal (a system prompt).
//
// Never asserts anything: a benchmark prints numbers (docs/TESTING.md). The last stdout line is
// one JSON object. Node 18+ (no packages). Usage:
//   node bench/serve_load.mjs --url http://127.0.0.1:8080 --users 4 --requests 2 --prompt 16 --gen 64
import http from 'node:http';

const args = process.argv.slice(2);
const opt = {url: 'http://127.0.0.1:8080', model: '', users: 1, requests: 1, rate: 0, duration: 10,
             prompt: 16, gen: 64, seed: 1, 'shared-prefix': 0, 'long-prompt': 0, probes: 5, 'probe-gen': 4,
             label: '', timeout: 600};
for (let i = 0; i < args.length; i++) {
    const a = args[i];
    if (!a.startsWith('--') || !(a.slice(2) in opt)) { console.error(`serve_load: unknown option '${a}'`); process.exit(2); }
    const k = a.slice(2), v = args[++i];
    opt[k] = typeof opt[k] === 'number' ? Number(v) : v;
}
const U = new URL(opt.url);
// One connection per request (no keep-alive): llama-server closes the connection after a streamed
// response although it answers "Keep-Alive: timeout=5", so a reused socket raced that close and a
// user's second request died with "socket hang up" (curl sees "Connection 0 seems to be dead" and
// reconnects). A loopback connect costs microseconds against a request's seconds, and every server
// gets the same treatment.
const agent = new http.Agent({keepAlive: false, maxSockets: 256});

let rng = opt.seed >>> 0 || 1;
function rand() { // xorshift32: the same prompts on every server for the same seed
    rng ^= rng << 13; rng >>>= 0; rng ^= rng >>> 17; rng ^= rng << 5; rng >>>= 0;
    return rng / 4294967296;
}
const shared = Array.from({length: opt['shared-prefix']}, () => 100 + Math.floor(rand() * 29900));
function prompt(n) {
    const p = shared.slice(0, Math.min(n, shared.length));
    while (p.length < n) p.push(100 + Math.floor(rand() * 29900));
    return p;
}

const now = () => Number(process.hrtime.bigint()) / 1e9;

// One streaming request; resolves {ok, t0, ttft, gaps[], tokens, end, err}.
function request(ids, gen) {
    return new Promise((resolve) => {
        const body = JSON.stringify({...(opt.model ? {model: opt.model} : {}), prompt: ids, max_tokens: gen, temperature: 0, stream: true,
                                     stream_options: {include_usage: true}, ignore_eos: true, cache_prompt: true});
        const r = {ok: false, t0: now(), ttft: null, gaps: [], tokens: 0, chunks: 0, end: null, err: null};
        let last = null, buf = '';
        const req = http.request({hostname: U.hostname, port: U.port, path: '/v1/completions', method: 'POST', agent,
                                  headers: {'content-type': 'application/json', 'content-length': Buffer.byteLength(body)},
                                  timeout: opt.timeout * 1000}, (res) => {
            res.setEncoding('utf8');
            res.on('data', (d) => {
                buf += d;
                let k;
                while ((k = buf.indexOf('\n\n')) >= 0) {
                    const ev = buf.slice(0, k);
                    buf = buf.slice(k + 2);
                    for (const line of ev.split('\n')) {
                        if (!line.startsWith('data: ')) continue;
                        const data = line.slice(6).trim();
                        if (data === '[DONE]') { r.ok = res.statusCode === 200 && !r.err; continue; }
                        let o;
                        try { o = JSON.parse(data); } catch { continue; }
                        if (o.error) { r.err = o.error.message || 'error'; continue; }
                        if (o.usage && o.usage.completion_tokens != null) r.tokens = o.usage.completion_tokens;
                        const c = o.choices && o.choices[0];
                        if (!c || c.finish_reason || c.text == null || c.text === '') continue;
                        const t = now();
                        if (r.ttft === null) r.ttft = t - r.t0;
                        else r.gaps.push(t - last);
                        last = t;
                        r.chunks++;
                    }
                }
            });
            res.on('end', () => {
                r.end = now();
                if (res.statusCode !== 200) r.err = r.err || `HTTP ${res.statusCode}: ${buf.slice(0, 200)}`;
                resolve(r);
            });
        });
        req.on('timeout', () => req.destroy(new Error('timeout')));
        req.on('error', (e) => { r.err = String(e.message || e); r.end = now(); resolve(r); });
        req.end(body);
    });
}

function pct(xs, p) {
    if (!xs.length) return null;
    const s = [...xs].sort((a, b) => a - b);
    return s[Math.min(s.length - 1, Math.max(0, Math.ceil(p / 100 * s.length) - 1))];
}
const ms = (x) => x == null ? null : Math.round(x * 10000) / 10;

function report(mode, rs, t0, t1, extra = {}) {
    const ok = rs.filter((r) => r.ok);
    const tokens = ok.reduce((a, r) => a + r.tokens, 0);
    const gaps = ok.flatMap((r) => r.gaps), ttft = ok.map((r) => r.ttft).filter((x) => x != null);
    const o = {bench: 'serve_load', label: opt.label, mode, url: opt.url, users: opt.users, rate: opt.rate,
               prompt: opt.prompt, gen: opt.gen, requests: rs.length, ok: ok.length, failed: rs.length - ok.length,
               tokens, seconds: Math.round((t1 - t0) * 1000) / 1000, agg_tps: Math.round(tokens / (t1 - t0) * 100) / 100,
               ttft_p50_ms: ms(pct(ttft, 50)), ttft_p99_ms: ms(pct(ttft, 99)),
               itl_p50_ms: ms(pct(gaps, 50)), itl_p99_ms: ms(pct(gaps, 99)), ...extra};
    const errs = rs.filter((r) => !r.ok).map((r) => r.err).slice(0, 3);
    if (errs.length) o.errors = errs;
    console.log(`${opt.label ? opt.label + ': ' : ''}${mode} users=${opt.users} rate=${opt.rate} ` +
                `${o.ok}/${o.requests} ok, ${tokens} tokens in ${o.seconds} s = ${o.agg_tps} tok/s; ` +
                `TTFT p50 ${o.ttft_p50_ms} p99 ${o.ttft_p99_ms} ms; ITL p50 ${o.itl_p50_ms} p99 ${o.itl_p99_ms} ms`);
    console.log(JSON.stringify(o));
    return o;
}

async function closedLoop() {
    const rs = [];
    const t0 = now();
    await Promise.all(Array.from({length: opt.users}, async () => {
        for (let i = 0; i < opt.requests; i++) rs.push(await request(prompt(opt.prompt), opt.gen));
    }));
    return report('closed', rs, t0, now());
}

async function openLoop() {
    const rs = [], pend = [];
    const t0 = now();
    let t = 0;
    while (true) {
        t += -Math.log(1 - rand()) / opt.rate;
        if (t > opt.duration) break;
        const wait = t0 + t - now();
        if (wait > 0) await new Promise((res) => setTimeout(res, wait * 1000));
        pend.push(request(prompt(opt.prompt), opt.gen).then((r) => rs.push(r)));
    }
    await Promise.all(pend);
    return report('open', rs, t0, now());
}

// Users decode; a long prompt arrives; short probes measure TTFT one at a time meanwhile.
async function probe() {
    const bg = [];
    for (let u = 0; u < opt.users; u++) {
        bg.push(request(prompt(opt.prompt), opt.gen));
    }
    // let every background user get past its prefill and stream
    const t0 = now();
    await new Promise((res) => setTimeout(res, opt.users ? 1500 + 200 * opt.users : 0));
    const long = opt['long-prompt'] > 0 ? request(prompt(opt['long-prompt']), 4) : null;
    const probes = [];
    for (let i = 0; i < opt.probes; i++) probes.push(await request(prompt(opt.prompt), opt['probe-gen']));
    const lr = long ? await long : null;
    const bgr = await Promise.all(bg);
    const t1 = now();
    const ttft = probes.filter((r) => r.ok).map((r) => r.ttft);
    return report('probe', probes, t0, t1, {
        long_prompt: opt['long-prompt'], long_ok: lr ? lr.ok : null, long_ttft_ms: lr ? ms(lr.ttft) : null,
        background_ok: bgr.filter((r) => r.ok).length,
        background_itl_p99_ms: ms(pct(bgr.flatMap((r) => r.gaps), 99)),
        background_itl_max_ms: ms(Math.max(0, ...bgr.flatMap((r) => r.gaps))),
        probe_ttft_ms: ttft.map(ms)});
}

const mode = opt['long-prompt'] > 0 || (opt.users === 0) ? probe : opt.rate > 0 ? openLoop : closedLoop;
mode().then(() => agent.destroy(), (e) => { console.error(e); process.exit(1); });
