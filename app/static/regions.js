// XRAI's regions on the page (postprocess=xrai): the answer's regions.labels_png, a 16-bit greyscale PNG whose pixels are
// their region's rank, decoded here (an <img> keeps 8 bits of each pixel), and the outlines of the first regions that
// together cover at most a share of the image, as the service draws them (visualization=outlines) and the Python
// client reads them (Regions.top). No DOM at load: tests/service/test_page_controls.py runs these functions in Node.
"use strict";

function base64Bytes(b64) {
  const text = atob(b64);
  const out = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) out[i] = text.charCodeAt(i);
  return out;
}

// {width, height, labels: Uint16Array} of a non-interlaced 8- or 16-bit greyscale PNG (base64)
async function decodeLabels(b64) {
  const bytes = base64Bytes(b64);
  const view = new DataView(bytes.buffer);
  let width = 0, height = 0, depth = 0;
  const parts = [];
  for (let at = 8; at < bytes.length;) {
    const length = view.getUint32(at), type = String.fromCharCode(...bytes.subarray(at + 4, at + 8));
    const data = bytes.subarray(at + 8, at + 8 + length);
    if (type === "IHDR") {
      width = view.getUint32(at + 8); height = view.getUint32(at + 12); depth = data[8];
      if (data[9] !== 0 || data[12] !== 0 || (depth !== 8 && depth !== 16)) throw new Error("labels_png: not a plain greyscale PNG");
    } else if (type === "IDAT") parts.push(data);
    else if (type === "IEND") break;
    at += 12 + length;
  }
  const inflated = new Blob(parts).stream().pipeThrough(new DecompressionStream("deflate"));
  const raw = new Uint8Array(await new Response(inflated).arrayBuffer());
  const bpp = depth / 8, stride = width * bpp;
  const rows = new Uint8Array(height * stride);
  for (let y = 0; y < height; y++) {  // undo each row's filter (PNG's five)
    const filter = raw[y * (stride + 1)], src = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1));
    const row = rows.subarray(y * stride, (y + 1) * stride), up = y ? rows.subarray((y - 1) * stride, y * stride) : null;
    for (let i = 0; i < stride; i++) {
      const a = i >= bpp ? row[i - bpp] : 0, b = up ? up[i] : 0, c = up && i >= bpp ? up[i - bpp] : 0;
      let p = 0;
      if (filter === 1) p = a;
      else if (filter === 2) p = b;
      else if (filter === 3) p = (a + b) >> 1;
      else if (filter === 4) {
        const pa = Math.abs(b - c), pb = Math.abs(a - c), pc = Math.abs(a + b - 2 * c);
        p = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      }
      row[i] = (src[i] + p) & 255;
    }
  }
  const labels = new Uint16Array(width * height);
  for (let i = 0; i < labels.length; i++) labels[i] = bpp === 2 ? (rows[2 * i] << 8) | rows[2 * i + 1] : rows[i];
  return { width, height, labels };
}

// how many first regions cover at most `share` of the image (at least the first), from their shares
function topCount(shares, share) {
  let covered = 0, count = 0;
  for (const s of shares) {
    covered += s;
    if (covered > share + 1e-12) break;
    count += 1;
  }
  return Math.max(1, count);
}

// Uint8Array: 1 where a pixel of the first `count` regions is within `width` steps of a pixel outside them or of the
// border: the outline of the regions together, as the service draws it
function outlineMask(decoded, count, width) {
  const { width: w, height: h, labels } = decoded;
  const shown = (i) => (labels[i] <= count ? 1 : 0);
  const edge = new Uint8Array(w * h);
  for (let y = 0; y < h; y++) {
    for (let x = 0; x < w; x++) {
      const own = shown(y * w + x);
      if (!own) continue;
      search: for (let dy = -width; dy <= width; dy++) {
        for (let dx = -width + Math.abs(dy); dx <= width - Math.abs(dy); dx++) {
          const yy = y + dy, xx = x + dx;
          if (yy < 0 || yy >= h || xx < 0 || xx >= w || shown(yy * w + xx) !== own) { edge[y * w + x] = 1; break search; }
        }
      }
    }
  }
  return edge;
}

if (typeof module !== "undefined") module.exports = { decodeLabels, topCount, outlineMask };
