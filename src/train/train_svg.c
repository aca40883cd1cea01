/*
 * train_svg.c: the loss curve of a fine-tuning run as a small standalone
 * SVG (train loss per step, validation loss at its evals), written next to
 * the adapter so a user can open it in any browser. Pure formatting.
 */
#include "finetune.h"

#include <math.h>

enum { W = 720, H = 400, L = 60, R = 20, TOP = 30, BOT = 50 };

void cm_finetune_svg(const float *hist, int64_t n, cm_buf *out) {
    double smax = 1, lmin = INFINITY, lmax = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        const float *e = hist + 3 * i;
        smax = e[0] > smax ? e[0] : smax;
        for (int k = 1; k < 3; k++)
            if (isfinite(e[k])) lmin = e[k] < lmin ? e[k] : lmin, lmax = e[k] > lmax ? e[k] : lmax;
    }
    if (!(lmax >= lmin)) lmin = 0, lmax = 1;
    if (lmax - lmin < 1e-6) lmax = lmin + 1e-6;
    lmin = lmin > 0 ? 0 : lmin;
    cm_buf_printf(out,
                  "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
                  "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                  W, H);
    cm_buf_printf(
        out, "<text x=\"%d\" y=\"18\">cumulo finetune: loss per step (blue: train, orange: validation)</text>\n", L);
    cm_buf_printf(out, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, H - BOT, W - R,
                  H - BOT);
    cm_buf_printf(out, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, TOP, L, H - BOT);
    for (int t = 0; t <= 4; t++) {
        const double v = lmin + (lmax - lmin) * t / 4, y = H - BOT - (double)(H - TOP - BOT) * t / 4;
        cm_buf_printf(out, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.3g</text>\n", L - 6, y + 4, v);
        const double s = smax * t / 4, x = L + (double)(W - L - R) * t / 4;
        cm_buf_printf(out, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.0f</text>\n", x, H - BOT + 18, s);
    }
    cm_buf_printf(out, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n", (L + W - R) / 2, H - 12);
    static const char *const color[3] = {"", "#1f77b4", "#ff7f0e"};
    for (int k = 1; k < 3; k++) {
        cm_buf_printf(out, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", color[k]);
        for (int64_t i = 0; i < n; i++) {
            const float *e = hist + 3 * i;
            if (!isfinite(e[k])) continue;
            const double x = L + (double)(W - L - R) * e[0] / smax,
                         y = H - BOT - (double)(H - TOP - BOT) * (e[k] - lmin) / (lmax - lmin);
            cm_buf_printf(out, "%.1f,%.1f ", x, y);
        }
        cm_buf_puts(out, "\"/>\n");
    }
    cm_buf_puts(out, "</svg>\n");
}
