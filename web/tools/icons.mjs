// Draws the home-screen icons (the `>_` of icon.svg) as PNGs with plain
// code, so the build needs no image tools and gives the same bytes every
// time: a distance field per shape, 4x4 supersampling, zlib from Node.

import { deflateSync } from "node:zlib";

const BG = [0x0f, 0x11, 0x15];
const CHEVRON = [0xf0, 0xc6, 0x74];
const BAR = [0xe6, 0xe6, 0xe6];

function segmentDistance(px, py, ax, ay, bx, by) {
  const dx = bx - ax;
  const dy = by - ay;
  const t = Math.max(0, Math.min(1, ((px - ax) * dx + (py - ay) * dy) / (dx * dx + dy * dy)));
  return Math.hypot(px - (ax + t * dx), py - (ay + t * dy));
}

/** Colour at (x, y) in the 64-unit design space, or null outside the icon. */
function shade(x, y, { inset, rounded }) {
  // Scale the design into the safe area (maskable icons keep a margin).
  const u = (x - inset) / (1 - 2 * inset / 64);
  const v = (y - inset) / (1 - 2 * inset / 64);
  if (rounded) {
    const r = 12;
    const cx = Math.max(r, Math.min(64 - r, x));
    const cy = Math.max(r, Math.min(64 - r, y));
    if (Math.hypot(x - cx, y - cy) > r) return null;
  }
  const half = 3;
  if (segmentDistance(u, v, 16, 20, 30, 32) <= half || segmentDistance(u, v, 30, 32, 16, 44) <= half) return CHEVRON;
  if (segmentDistance(u, v, 34, 44, 48, 44) <= half) return BAR;
  return BG;
}

function crc32(bytes) {
  let crc = ~0;
  for (const b of bytes) {
    crc ^= b;
    for (let k = 0; k < 8; k++) crc = (crc >>> 1) ^ (0xedb88320 & -(crc & 1));
  }
  return ~crc >>> 0;
}

function chunk(type, data) {
  const out = Buffer.alloc(12 + data.length);
  out.writeUInt32BE(data.length, 0);
  out.write(type, 4, "latin1");
  data.copy(out, 8);
  out.writeUInt32BE(crc32(out.subarray(4, 8 + data.length)), 8 + data.length);
  return out;
}

/** An RGBA PNG of the icon, `size` pixels square. */
export function iconPng(size, { maskable = false } = {}) {
  const options = maskable ? { inset: 10, rounded: false } : { inset: 0, rounded: true };
  const samples = 4;
  const raw = Buffer.alloc(size * (size * 4 + 1));
  for (let py = 0; py < size; py++) {
    const row = py * (size * 4 + 1);
    raw[row] = 0; // filter: none
    for (let px = 0; px < size; px++) {
      let r = 0, g = 0, b = 0, a = 0;
      for (let sy = 0; sy < samples; sy++) {
        for (let sx = 0; sx < samples; sx++) {
          const x = ((px + (sx + 0.5) / samples) / size) * 64;
          const y = ((py + (sy + 0.5) / samples) / size) * 64;
          const c = shade(x, y, options);
          if (!c) continue;
          r += c[0]; g += c[1]; b += c[2]; a += 255;
        }
      }
      const n = samples * samples;
      const covered = a / 255;
      const o = row + 1 + px * 4;
      raw[o] = covered ? Math.round(r / covered) : 0;
      raw[o + 1] = covered ? Math.round(g / covered) : 0;
      raw[o + 2] = covered ? Math.round(b / covered) : 0;
      raw[o + 3] = Math.round(a / n);
    }
  }
  const header = Buffer.alloc(13);
  header.writeUInt32BE(size, 0);
  header.writeUInt32BE(size, 4);
  header[8] = 8; // bit depth
  header[9] = 6; // RGBA
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk("IHDR", header),
    chunk("IDAT", deflateSync(raw, { level: 9 })),
    chunk("IEND", Buffer.alloc(0)),
  ]);
}
