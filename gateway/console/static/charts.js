// Tiny SVG time-series charts: one or two lines over a fixed box, scaled to their max.

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 120;
const HEIGHT = 40;

export class Sparkline {
  /** `label` names the chart for screen readers; `lines` is 1 or 2; `max` fixes the
   * top of the scale (else the largest value drawn). */
  constructor(label, lines = 1, max = null) {
    this.max = max;
    this.svg = document.createElementNS(SVG, "svg");
    this.svg.setAttribute("viewBox", `0 0 ${WIDTH} ${HEIGHT}`);
    this.svg.setAttribute("preserveAspectRatio", "none");
    this.svg.setAttribute("role", "img");
    this.svg.setAttribute("aria-label", label);
    this.paths = [];
    for (const name of ["a", "b"].slice(0, lines)) {
      const path = document.createElementNS(SVG, "path");
      path.setAttribute("class", name);
      path.setAttribute("vector-effect", "non-scaling-stroke");
      this.svg.append(path);
      this.paths.push(path);
    }
  }

  /** Each series is an array of numbers or nulls (gaps), oldest first. */
  draw(...series) {
    const values = series.flat().filter((v) => typeof v === "number" && Number.isFinite(v));
    const max = this.max ?? Math.max(1e-9, ...values);
    series.forEach((points, index) => {
      const path = this.paths[index];
      if (!path) return;
      const step = points.length > 1 ? WIDTH / (points.length - 1) : WIDTH;
      let d = "";
      let pen = false;
      points.forEach((value, i) => {
        if (typeof value !== "number" || !Number.isFinite(value)) {
          pen = false;
          return;
        }
        const x = (i * step).toFixed(1);
        const y = (HEIGHT - 2 - (value / max) * (HEIGHT - 4)).toFixed(1);
        d += `${pen ? "L" : "M"}${x} ${y} `;
        pen = true;
      });
      // A lone point (a fresh page, or between gaps) gets a short stroke so it shows.
      d = d.replace(/(M([\d.]+) [\d.]+) (?=M|$)/g, (_, move, x) =>
        `${move} h${Number(x) > WIDTH / 2 ? -2 : 2} `,
      );
      path.setAttribute("d", d.trim());
    });
  }
}

/** A bounded history for figures the server gives only as "now" (percentiles, gauges). */
export class History {
  constructor(size = 60) {
    this.size = size;
    this.points = [];
  }

  push(value) {
    this.points.push(typeof value === "number" ? value : null);
    if (this.points.length > this.size) this.points.shift();
    // Padded on the left, so the newest point is always at the right edge.
    return Array(this.size - this.points.length).fill(null).concat(this.points);
  }
}
