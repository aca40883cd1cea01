// tests/js/dashboard.mjs: headless Chromium (Debian's /usr/bin/chromium via
// playwright-core) against the dashboard of `cumulo serve`: the page loads
// from the binary, shows the node(s) with role and layers, draws live charts,
// and a chat message sent from the page streams an answer into it; no request
// leaves the server (no CDN). Screenshots go to tests/artifacts/.
// argv: URL API_KEY ARTIFACT_DIR EXPECTED_NODES. Prints "N passed, N failed".
import { chromium } from "playwright-core";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

const [url, apiKey, artifacts, nodesWanted] = process.argv.slice(2);
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
  await page.waitForSelector("g.node", { timeout: 15000 });
  const nodes = await page.$$eval("g.node", gs => gs.map(g => g.textContent));
  check("nodes shown", nodes.length === Number(nodesWanted), nodes);
  check("node shows role and layers", nodes.every(t => /role: /.test(t) && /layers \d+–\d+/.test(t)), nodes);
  check("node shows memory, tokens/s, watts (labelled), tokens/W",
        nodes.every(t => /memory .* GiB/.test(t) && /tokens\/s/.test(t) && /W \((measured|estimated)\)/.test(t) && /tokens\/W/.test(t)), nodes);
  await page.waitForTimeout(2500); // a few polls for the charts
  const chartInk = await page.$eval("#c_tps", c => { const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
    let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n; });
  check("tokens/s chart drawn", chartInk > 0, chartInk);
  await page.screenshot({ path: path.join(artifacts, "dashboard.png"), fullPage: true });

  const msg = "Tell me about a cat.";
  await page.fill("#msg", msg);
  await page.click("#send");
  await page.waitForSelector("#answer-1[data-done='1']", { timeout: 60000 });
  const answer = await page.$eval("#answer-1", e => e.textContent);
  check("streamed answer shown", answer.length > 0 && !/error/.test(answer), answer);
  const model = (await (await fetch(url + "/v1/models", { headers: apiKey ? { Authorization: "Bearer " + apiKey } : {} })).json()).data[0].id;
  check("chat answer is the model's (not an error)", !answer.startsWith("error"), answer);
  await page.screenshot({ path: path.join(artifacts, "dashboard-chat.png"), fullPage: true });
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
