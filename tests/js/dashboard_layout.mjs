// tests/js/dashboard_layout.mjs: the dashboard's layout for 2 to 16 nodes, in
// headless Chromium (Debian's /usr/bin/chromium via playwright-core). The page
// comes from a real `cumulo serve` (a 3-node cluster, see
// tests/sh/http_cluster_dash.sh); its /api/cluster answer is replaced by one
// of N nodes built from the real one's shape (names like "rack2-box-07",
// addresses, layer ranges, links), since this machine cannot run 8 or 16
// nodes. At 800, 1400 and 1920 px wide, for 2, 4, 8 (and 16) nodes: every
// node is shown by its name, no text is clipped (no card or page wider than
// its box), every link label is inside the card it leads into and visible,
// no text is smaller than 12 px, the charts are drawn at the canvas's own
// pixel size (not scaled down) with a time axis and a legend. Screenshots:
// ARTIFACT_DIR/dash-N{n}-w{width}.png (kept out of git: tests/artifacts/).
// argv: URL API_KEY ARTIFACT_DIR. Prints "N passed, N failed".
import { chromium } from "playwright-core";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

const [url, apiKey, artifacts] = process.argv.slice(2);
const auth = apiKey ? { Authorization: "Bearer " + apiKey } : {};
let passed = 0, failed = 0;
function check(name, cond, detail) {
  if (cond) passed++;
  else { failed++; console.error("FAIL: " + name + (detail !== undefined ? ": " + JSON.stringify(detail) : "")); }
}

function fake(real, n) {
  const n_layer = 32, per = Math.floor(n_layer / n), extra = n_layer % n;
  const nodes = [];
  let at = 0;
  for (let i = 0; i < n; i++) {
    const base = JSON.parse(JSON.stringify(real.nodes[Math.min(i, real.nodes.length - 1)]));
    const k = per + (i < extra ? 1 : 0);
    base.layers = [at, at + k];
    at += k;
    base.stage = i;
    if (i === 0) { base.name = "coordinator-vm"; }
    else {
      base.id = `10.20.${Math.floor(i / 4)}.${100 + i}:7070`;
      base.name = `rack${1 + (i % 3)}-box-${String(i).padStart(2, "0")}`;
      base.role = "stage " + i;
      base.host = "remote";
    }
    nodes.push(base);
  }
  const links = [];
  for (let i = 0; i + 1 < n; i++)
    links.push({ from: nodes[i].id, to: nodes[i + 1].id, from_stage: i, to_stage: i + 1,
                 latency_ms: i % 3 === 2 ? null : 0.05 + 0.37 * i, bandwidth_mbps: i % 3 === 2 ? null : 940 - 13 * i,
                 source: i % 3 === 2 ? "not measured (node to node)" : "measured node to node", bytes: null });
  return { ...real, n_layer, n_stages: n, nodes, links };
}

fs.mkdirSync(artifacts, { recursive: true });
const profile = fs.mkdtempSync(path.join(os.tmpdir(), "cumulo-chromium-"));
let browser;
try {
  const real = await (await fetch(url + "/api/cluster", { headers: auth })).json();
  browser = await chromium.launchPersistentContext(profile, {
    executablePath: "/usr/bin/chromium", headless: true, viewport: { width: 1400, height: 900 },
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", e => errors.push(String(e)));
  if (apiKey) await page.addInitScript(k => localStorage.setItem("cumulo_key", k), apiKey);
  let current = null;
  await page.route("**/api/cluster", route => route.fulfill({ status: 200, contentType: "application/json",
                                                              body: JSON.stringify(current) }));
  for (const n of [2, 4, 8, 16]) {
    current = fake(real, n);
    for (const width of [800, 1400, 1920]) {
      const tag = `${n} nodes at ${width} px`;
      await page.setViewportSize({ width, height: 900 });
      await page.goto(url + "/", { waitUntil: "load" });
      await page.waitForFunction(k => document.querySelectorAll("div.node").length === k, n, { timeout: 15000 });
      await page.waitForTimeout(2300); // a few polls: the charts have points
      const r = await page.evaluate(() => {
        const px = e => parseFloat(getComputedStyle(e).fontSize);
        const nodes = [...document.querySelectorAll("div.node")];
        const inTopo = [...document.querySelectorAll("#topo *, .legend *, header *")].filter(e => e.childNodes.length &&
          [...e.childNodes].some(c => c.nodeType === 3 && c.textContent.trim()));
        const links = [...document.querySelectorAll(".lnk")].map(l => {
          const a = l.getBoundingClientRect(), card = l.closest("div.node").getBoundingClientRect();
          return { text: l.textContent, inside: a.left >= card.left - 0.5 && a.right <= card.right + 0.5 && a.top >= card.top - 0.5 &&
                   a.bottom <= card.bottom + 0.5, visible: a.width > 20 && a.height >= 12, clipped: l.scrollWidth > l.clientWidth + 1 };
        });
        const cv = [...document.querySelectorAll("canvas")].map(c => ({ w: c.width, cw: c.clientWidth, dpr: window.devicePixelRatio,
          ink: (() => { const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data; let k = 0;
                        for (let i = 3; i < d.length; i += 4) if (d[i]) k++; return k; })() }));
        return {
          names: nodes.map(e => e.querySelector(".t").textContent),
          overflowCards: nodes.filter(e => e.scrollWidth > e.clientWidth + 1).length,
          pageOverflow: document.documentElement.scrollWidth - window.innerWidth,
          minFont: Math.min(...inTopo.map(px)),
          smallest: inTopo.filter(e => px(e) < 12).slice(0, 3).map(e => e.outerHTML.slice(0, 80)),
          links, cv,
          legends: [...document.querySelectorAll(".legend")].filter(l => l.offsetParent !== null).map(l => l.textContent), /* shown ones: the fine-tuning panel stays hidden without a job */
          rows: new Set(nodes.map(e => Math.round(e.getBoundingClientRect().top))).size,
        };
      });
      const want = current.nodes.map(d => d.name);
      check(`${tag}: nodes shown by name`, JSON.stringify(r.names) === JSON.stringify(want), r.names);
      check(`${tag}: no card clips its text`, r.overflowCards === 0, r.overflowCards);
      check(`${tag}: the page is not wider than the window`, r.pageOverflow <= 0, r.pageOverflow);
      check(`${tag}: no text under 12 px`, r.minFont >= 12, { min: r.minFont, smallest: r.smallest });
      check(`${tag}: ${n - 1} link labels, each inside its card, visible, not clipped`,
            r.links.length === n - 1 && r.links.every(l => l.inside && l.visible && !l.clipped), r.links);
      check(`${tag}: link labels name the node they come from`,
            r.links.every((l, i) => l.text.includes(want[i]) && (/[0-9.]+ ms · [0-9]+ Mb\/s/.test(l.text) || /not measured/.test(l.text))),
            r.links.map(l => l.text));
      check(`${tag}: charts drawn at their own pixel size`, r.cv.length === 2 &&
            r.cv.every(c => Math.abs(c.w - Math.round(c.cw * c.dpr)) <= 1 && c.ink > 0), r.cv);
      check(`${tag}: chart legends`, r.legends.length === 2 && /tokens\/s/.test(r.legends[0]) &&
            /queued/.test(r.legends[1]) && /active slots/.test(r.legends[1]), r.legends);
      if (n >= 8) check(`${tag}: the nodes wrap onto rows`, r.rows >= 2, r.rows);
      if (n <= 8) await page.screenshot({ path: path.join(artifacts, `dash-N${n}-w${width}.png`), fullPage: true });
    }
  }
  check("no page errors", errors.length === 0, errors);
} catch (e) {
  check("no unexpected exception", false, String(e && e.stack || e));
} finally {
  if (browser) await browser.close();
  fs.rmSync(profile, { recursive: true, force: true });
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
