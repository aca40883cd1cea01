// tests/js/dashboard.mjs: headless Chromium (Debian's /usr/bin/chromium via
// playwright-core) against the dashboard of `cumulo serve`: the page loads
// from the binary, shows the node(s) with role and layers, draws live charts,
// and a chat message sent from the page streams an answer into it; no request
// leaves the server (no CDN). Screenshots go to tests/artifacts/.
// With more than one node (a cluster): the layer ranges shown equal
// /api/cluster's, are contiguous and cover every layer, one node is the
// coordinator and the others stages, and consecutive stages are linked.
// argv: URL API_KEY ARTIFACT_DIR EXPECTED_NODES [SCREENSHOT_PREFIX].
// Prints "N passed, N failed".
import { chromium } from "playwright-core";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

const [url, apiKey, artifacts, nodesWanted, prefix = "dashboard"] = process.argv.slice(2);
const auth = apiKey ? { Authorization: "Bearer " + apiKey } : {};
let passed = 0, failed = 0;
function check(name, cond, detail) {
  if (cond) passed++;
  else { failed++; console.error("FAIL: " + name + (detail !== undefined ? ": " + JSON.stringify(detail) : "")); }
}
fs.mkdirSync(artifacts, { recursive: true });
const profile = fs.mkdtempSync(path.join(os.tmpdir(), "cumulo-chromium-"));
let browser;
try {
  // A fresh --user-data-dir: playwright passes it for a persistent context.
  browser = await chromium.launchPersistentContext(profile, {
    executablePath: "/usr/bin/chromium", headless: true, viewport: { width: 1200, height: 900 },
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", e => errors.push(String(e)));
  const outside = [];
  page.on("request", r => { if (!r.url().startsWith(url)) outside.push(r.url()); });
  if (apiKey) await page.addInitScript(k => localStorage.setItem("cumulo_key", k), apiKey);
  const resp = await page.goto(url + "/", { waitUntil: "load" });
  check("dashboard 200", resp.status() === 200, resp.status());
  await page.waitForSelector("div.node", { timeout: 15000 });
  const nodes = await page.$$eval("div.node", gs => gs.map(g => g.innerText));
  check("nodes shown", nodes.length === Number(nodesWanted), nodes);
  check("node shows role and layers", nodes.every(t => /role: /.test(t) && /layers \d+–\d+/.test(t)), nodes);
  // Remote nodes report no power: they must say "unknown", never a number.
  check("node shows memory, tokens/s, watts (labelled) or unknown, tokens/W",
        nodes.every(t => /memory .* GiB/.test(t) && /tokens\/s/.test(t) &&
                         (/W \((measured|estimated)\)/.test(t) && /[0-9.]+ tokens\/W/.test(t) ||
                          /power unknown/.test(t) && /tokens\/W unknown/.test(t))), nodes);
  check("this machine's power is labelled measured or estimated", /W \((measured|estimated)\)/.test(nodes[0] || ""), nodes[0]);
  if (Number(nodesWanted) > 1) {
    const c = await (await fetch(url + "/api/cluster", { headers: auth })).json();
    const shown = nodes.map(t => { const m = t.match(/layers (\d+)–(\d+)/); return m ? [Number(m[1]), Number(m[2]) + 1] : null; });
    check("layer ranges shown equal /api/cluster's", JSON.stringify(shown) === JSON.stringify(c.nodes.map(n => n.layers)),
          { shown, api: c.nodes.map(n => n.layers) });
    let at = 0, contiguous = true;
    for (const r of shown) { if (!r || r[0] !== at || r[1] <= r[0]) contiguous = false; else at = r[1]; }
    check("layers shown are contiguous and cover all " + c.n_layer + " layers", contiguous && at === c.n_layer && c.n_layer > 0,
          { shown, n_layer: c.n_layer });
    check("one coordinator, the rest stages 1..", /role: coordinator/.test(nodes[0]) &&
          nodes.slice(1).every((t, i) => new RegExp("role: stage " + (i + 1) + "(?![0-9])").test(t)), nodes);
    const ids = await page.$$eval("div.node", gs => gs.map(g => g.dataset.node));
    check("node ids are /api/cluster's", JSON.stringify(ids) === JSON.stringify(c.nodes.map(n => n.id)), ids);
    const names = await page.$$eval("div.node .t", gs => gs.map(g => g.textContent));
    check("nodes shown by --name where they have one", JSON.stringify(names) === JSON.stringify(c.nodes.map(n => n.name || n.id)),
          { names, api: c.nodes.map(n => [n.id, n.name]) });
    const links = await page.$$eval(".lnk", gs => gs.map(g => g.textContent));
    check("consecutive stages linked", links.length === Number(nodesWanted) - 1, links);
    check("first link shows its measured latency and bandwidth", /[0-9.]+ ms/.test(links[0] || "") && /Mb\/s/.test(links[0] || "") &&
          typeof c.links[0].latency_ms === "number", { links, api: c.links });
  }
  await page.waitForTimeout(2500); // a few polls for the charts
  const chartInk = await page.$eval("#c_tps", c => { const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
    let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n; });
  check("tokens/s chart drawn", chartInk > 0, chartInk);
  await page.screenshot({ path: path.join(artifacts, prefix + ".png"), fullPage: true });

  const msg = "Tell me about a cat.";
  await page.fill("#msg", msg);
  await page.click("#send");
  await page.waitForSelector("#answer-1[data-done='1']", { timeout: 60000 });
  const answer = await page.$eval("#answer-1", e => e.textContent);
  check("streamed answer shown", answer.length > 0 && !/error/.test(answer), answer);
  const model = (await (await fetch(url + "/v1/models", { headers: auth })).json()).data[0].id;
  check("chat answer is the model's (not an error)", !answer.startsWith("error"), answer);
  await page.screenshot({ path: path.join(artifacts, prefix + "-chat.png"), fullPage: true });
  check("no page errors", errors.length === 0, errors);
  check("no request leaves the server (no CDN)", outside.length === 0, outside);
  check("model id known", typeof model === "string" && model.length > 0, model);
} catch (e) {
  check("no unexpected exception", false, String(e && e.stack || e));
} finally {
  if (browser) await browser.close();
  fs.rmSync(profile, { recursive: true, force: true });
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
