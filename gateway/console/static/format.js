// Small, pure formatters shared by the views.

export function seconds(value) {
  if (value === null || value === undefined) return "–";
  if (value < 1) return `${(value * 1000).toFixed(value < 0.01 ? 1 : 0)} ms`;
  return `${value.toFixed(2)} s`;
}

export function rate(value, unit) {
  if (value === null || value === undefined) return "–";
  return `${value >= 10 ? value.toFixed(0) : value.toFixed(2)} ${unit}`;
}

export function bytes(value) {
  if (!value) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let size = value;
  let unit = 0;
  while (size >= 1000 && unit < units.length - 1) {
    size /= 1000;
    unit += 1;
  }
  return `${size.toFixed(size >= 100 ? 0 : 1)} ${units[unit]}`;
}

export function percent(value) {
  if (value === null || value === undefined) return "–";
  return `${(value * 100).toFixed(1)} %`;
}

export function clock(epochSeconds) {
  if (!epochSeconds) return "–";
  return new Date(epochSeconds * 1000).toLocaleTimeString([], { hour12: false });
}

export function ago(epochSeconds, now = Date.now() / 1000) {
  if (!epochSeconds) return "–";
  const delta = Math.max(0, now - epochSeconds);
  if (delta < 60) return `${delta.toFixed(0)} s ago`;
  if (delta < 3600) return `${(delta / 60).toFixed(0)} min ago`;
  return `${(delta / 3600).toFixed(1)} h ago`;
}

export function usd(value) {
  if (value === null || value === undefined) return "–";
  if (value === 0) return "$0";
  if (value >= 0.01) return `$${value.toFixed(2)}`;
  // Small amounts keep two significant digits: $0.00021, not $0.00.
  const digits = Math.min(12, 1 - Math.floor(Math.log10(value)));
  return `$${value.toFixed(digits)}`;
}

export function count(value) {
  return value === null || value === undefined ? "–" : String(value);
}

/** A child element with text, for building rows without innerHTML. */
export function el(tag, text = "", className = "") {
  const node = document.createElement(tag);
  if (text) node.textContent = text;
  if (className) node.className = className;
  return node;
}
