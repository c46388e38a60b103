// The depot web UI: lists buckets and folders, uploads, previews, deletes.
// Talks to the native API (with `Authorization: Bearer <secret>` when the
// server has credentials); links that cannot carry headers (downloads,
// <img>, <video>) are SigV4 presigned S3 URLs. Visitors without
// credentials read public-read buckets through anonymous S3 requests.
'use strict';
(() => {
  const $ = (id) => document.getElementById(id);
  const PAGE = 200;
  const REGION = 'us-east-1';
  const S = { cfg: null, cred: null, bucket: null, prefix: '', search: '', cursors: [null], next: null, items: [], sort: { key: 'name', dir: 1 }, seq: 0, shown: 0, failed: false };
  const enc = new TextEncoder();

  // --- SHA-256 and HMAC: WebCrypto exists only in secure contexts, and a
  // depot on plain http is not one.
  const K = new Uint32Array([
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2]);
  function sha256(data) {
    const l = data.length, n = ((l + 72) >> 6) << 6;
    const m = new Uint8Array(n);
    m.set(data);
    m[l] = 0x80;
    const dv = new DataView(m.buffer);
    dv.setUint32(n - 4, (l * 8) >>> 0);
    dv.setUint32(n - 8, Math.floor(l / 0x20000000));
    const h = new Uint32Array([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19]);
    const w = new Uint32Array(64);
    for (let o = 0; o < n; o += 64) {
      for (let i = 0; i < 16; i++) w[i] = dv.getUint32(o + i * 4);
      for (let i = 16; i < 64; i++) {
        const x = w[i - 15], y = w[i - 2];
        w[i] = w[i - 16] + ((x >>> 7 | x << 25) ^ (x >>> 18 | x << 14) ^ (x >>> 3)) + w[i - 7] + ((y >>> 17 | y << 15) ^ (y >>> 19 | y << 13) ^ (y >>> 10));
      }
      let [a, b, c, d, e, f, g, k] = h;
      for (let i = 0; i < 64; i++) {
        const t1 = (k + ((e >>> 6 | e << 26) ^ (e >>> 11 | e << 21) ^ (e >>> 25 | e << 7)) + ((e & f) ^ (~e & g)) + K[i] + w[i]) | 0;
        const t2 = (((a >>> 2 | a << 30) ^ (a >>> 13 | a << 19) ^ (a >>> 22 | a << 10)) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
        k = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
      }
      h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += k;
    }
    const out = new Uint8Array(32), ov = new DataView(out.buffer);
    h.forEach((v, i) => ov.setUint32(i * 4, v));
    return out;
  }
  const concat = (a, b) => { const c = new Uint8Array(a.length + b.length); c.set(a); c.set(b, a.length); return c; };
  function hmac(key, msg) {
    const k = new Uint8Array(64);
    k.set(key.length > 64 ? sha256(key) : key);
    return sha256(concat(k.map((x) => x ^ 0x5c), sha256(concat(k.map((x) => x ^ 0x36), msg))));
  }
  const hex = (b) => Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');

  // S3's URI encoding: everything but unreserved characters (and `/` in paths).
  const uri = (s, slash) => Array.from(enc.encode(s), (b) => {
    const c = String.fromCharCode(b);
    return /[A-Za-z0-9_.~-]/.test(c) || (!slash && c === '/') ? c : '%' + b.toString(16).toUpperCase().padStart(2, '0');
  }).join('');
  // Browsers remove `.` and `..` segments from URLs, escaped or not, and
  // would send `a/../b` as `b`: the `/` that makes such a segment one
  // (before it, or after it first in the key) goes as %2F, which the
  // server reads as `/`. The command line does the same.
  const dot = (s) => s === '.' || s === '..';
  const keyPath = (key) => key.split('/').map((s, i, all) =>
    (i === 0 ? '' : dot(s) || (i === 1 && dot(all[0])) ? '%2F' : '/') + uri(s, true)).join('');
  const path = (bucket, key) => '/' + uri(bucket, true) + '/' + (key ? keyPath(key) : '');

  /** A SigV4 presigned URL (query authentication) for `method` on `p`. */
  function presign(method, p, params = {}, headers = {}, expires = 3600) {
    const now = new Date().toISOString().replace(/[-:]|\.\d{3}/g, '');
    const scope = `${now.slice(0, 8)}/${REGION}/s3/aws4_request`;
    const hs = Object.assign({ host: location.host }, headers);
    const names = Object.keys(hs).sort();
    const q = Object.assign({}, params, {
      'X-Amz-Algorithm': 'AWS4-HMAC-SHA256', 'X-Amz-Credential': `${S.cred.ak}/${scope}`, 'X-Amz-Date': now,
      'X-Amz-Expires': String(expires), 'X-Amz-SignedHeaders': names.join(';'),
    });
    const qs = Object.keys(q).sort().map((k) => uri(k, true) + '=' + uri(q[k], true)).join('&');
    // The canonical URI is the path decoded and encoded once again, as S3
    // and the server make it: a `/` sent as %2F is signed as `/`.
    const canonical = [method, uri(decodeURIComponent(p)), qs, names.map((n) => `${n}:${String(hs[n]).trim()}\n`).join(''), names.join(';'), 'UNSIGNED-PAYLOAD'].join('\n');
    const toSign = ['AWS4-HMAC-SHA256', now, scope, hex(sha256(enc.encode(canonical)))].join('\n');
    let key = enc.encode('AWS4' + S.cred.sk);
    for (const part of [now.slice(0, 8), REGION, 's3', 'aws4_request']) key = hmac(key, enc.encode(part));
    return `${p}?${qs}&X-Amz-Signature=${hex(hmac(key, enc.encode(toSign)))}`;
  }

  // --- Talking to the server.
  const mode = () => (!S.cfg.auth_required ? 'open' : S.cred ? 'signed' : 'anon');
  const canWrite = () => mode() !== 'anon';
  async function failure(status, statusText, text) {
    try { const j = JSON.parse(text); return `${status}: ${j.message || j.error}`; } catch { /* not JSON */ }
    const m = /<Message>([^<]*)<\/Message>/.exec(text || '');
    return `${status} ${statusText}${m ? ': ' + m[1] : ''}`;
  }
  async function call(method, url, { body, headers = {}, accept = 'application/json', bearer = true } = {}) {
    const h = Object.assign({ Accept: accept }, headers);
    if (S.cred && bearer) h.Authorization = 'Bearer ' + S.cred.sk;
    let r;
    try { r = await fetch(url, { method, headers: h, body, cache: 'no-store' }); } catch (e) { throw new Error(`the server could not be reached (${e.message})`); }
    if (!r.ok) {
      const text = await r.text().catch(() => '');
      if (r.status === 403 && S.cred && !(await credentialsHold())) throw new Error('the saved credentials are no longer valid: sign in again');
      throw new Error(await failure(r.status, r.statusText, text));
    }
    return r;
  }
  /** A presigned ListBuckets: checks the access key and the secret. */
  const verify = () => fetch(presign('GET', '/')).catch(() => null);
  // A refusal may be of the request, or of credentials that stopped
  // working (the secret was changed): those are asked again, once for all
  // the requests refused together.
  let checking = null;
  function credentialsHold() {
    checking ||= verify().then((r) => {
      checking = null;
      if (!r || r.status !== 403 || !S.cred) return true;
      S.cred = null;
      sessionStorage.removeItem('depot.cred');
      who();
      const why = 'The saved credentials are no longer valid (the secret may have changed). Sign in again, or cancel to browse the public buckets only.';
      // Cancelled: what anonymous visitors see. (A sign-in loads the page.)
      if (!$('ask').open) signIn(why).then(() => { if (!S.cred) load(true); });
      return false;
    });
    return checking;
  }
  function contentDisposition(name) {
    const ascii = name.replace(/[^\x20-\x7e]|["\\]/g, '_');
    return `attachment; filename="${ascii}"; filename*=UTF-8''${uri(name, true)}`;
  }
  /** A URL for an object that works without headers: downloads, players, copied links. */
  function objectUrl(it, { download = false, expires = 3600 } = {}) {
    const p = path(it.bucket, it.key), name = it.key.split('/').pop();
    if (mode() === 'signed') return presign('GET', p, download ? { 'response-content-disposition': contentDisposition(name) } : {}, {}, expires);
    if (mode() === 'anon') return download ? `${p}?response-content-disposition=${uri(contentDisposition(name), true)}` : p;
    return download ? p + '?download' : p;
  }

  async function listBuckets() {
    if (mode() === 'anon') return { items: S.cfg.public_buckets.map((name) => ({ kind: 'bucket', name })), next: null };
    const j = await (await call('GET', '/')).json();
    return { items: j.buckets.map((b) => ({ kind: 'bucket', name: b.name, modified: b.created })), next: null };
  }
  async function listObjects(cursor) {
    const full = S.prefix + S.search;
    let dirs, entries, next;
    if (mode() === 'anon') {
      // Keys come URL-encoded: XML cannot carry every character a key may
      // hold (it reads \r as \n and has no \x01 at all).
      let u = `/${uri(S.bucket, true)}?list-type=2&delimiter=%2F&encoding-type=url&max-keys=${PAGE}&prefix=${uri(full, true)}`;
      if (cursor) u += '&continuation-token=' + uri(cursor, true);
      const x = new DOMParser().parseFromString(await (await call('GET', u, { accept: 'application/xml' })).text(), 'application/xml');
      // A document that does not parse must not pass for an empty folder.
      if (x.getElementsByTagName('parsererror').length || x.documentElement.localName !== 'ListBucketResult') throw new Error('the listing the server sent could not be read');
      const text = (el, tag) => el.getElementsByTagName(tag)[0]?.textContent ?? '';
      const key = (el, tag) => decodeURIComponent(text(el, tag));
      dirs = Array.from(x.getElementsByTagName('CommonPrefixes'), (c) => key(c, 'Prefix'));
      entries = Array.from(x.getElementsByTagName('Contents'), (c) => ({
        key: key(c, 'Key'), size: Number(text(c, 'Size')), modified: text(c, 'LastModified'), etag: text(c, 'ETag').replace(/"/g, ''), content_type: '',
      }));
      // The continuation token is opaque: encoding-type leaves it as it is.
      next = text(x.documentElement, 'NextContinuationToken') || null;
    } else {
      let u = `${path(S.bucket, S.prefix)}?format=json&limit=${PAGE}`;
      if (S.search) u += '&prefix=' + uri(S.search, true);
      if (cursor) u += '&after=' + uri(cursor, true);
      const j = await (await call('GET', u)).json();
      ({ dirs, entries, next } = j);
    }
    const items = dirs.map((d) => ({ kind: 'dir', key: d, name: d.slice(S.prefix.length) }));
    for (const e of entries) {
      if (e.key !== S.prefix) items.push(Object.assign({ kind: 'file', name: e.key.slice(S.prefix.length) }, e));
    }
    return { items, next };
  }

  // --- Rendering.
  function el(tag, attrs = {}, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? '' : v);
    }
    e.append(...kids.filter((k) => k !== null && k !== undefined));
    return e;
  }
  function human(n) {
    // A total the server could not tell (null) is no number of bytes.
    if (typeof n !== 'number' || !Number.isFinite(n)) return '—';
    if (n < 1024) return `${n} B`;
    const units = ['KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
    let i = -1;
    do { n /= 1024; i++; } while (n >= 1024 && i < units.length - 1);
    return `${n.toFixed(n < 10 ? 1 : 0)} ${units[i]}`;
  }
  const when = (s) => (s ? new Date(s).toLocaleString() : '');
  function say(text, isError = false) {
    const s = $('status');
    s.textContent = text;
    s.className = isError ? 'err' : '';
  }
  const navLink = (href, text, attrs = {}) => el('a', Object.assign({ href, 'data-nav': '' }, attrs), text);

  function crumbs() {
    const nav = $('crumbs');
    nav.replaceChildren();
    const parts = [['/', 'Buckets']];
    if (S.bucket !== null) {
      parts.push([path(S.bucket, ''), S.bucket]);
      // Every segment is a folder, an empty one too: `a//b/` is in `a//`.
      let acc = '';
      for (const seg of S.prefix.split('/').slice(0, -1)) { acc += seg + '/'; parts.push([path(S.bucket, acc), seg]); }
    }
    parts.forEach(([href, text], i) => {
      if (i) nav.append(el('span', { class: 'sep', 'aria-hidden': 'true' }, '/'));
      // An empty name, shown apart from a folder really named "(empty)".
      const attrs = text ? {} : { class: 'blank', title: 'a folder with an empty name' };
      const label = text || '(empty)';
      nav.append(i === parts.length - 1 ? el('span', Object.assign({ 'aria-current': 'page' }, attrs), label) : navLink(href, label, attrs));
    });
    document.title = S.bucket === null ? 'depot' : `${S.bucket}/${S.prefix} · depot`;
  }

  function sorted() {
    const { key, dir } = S.sort, rank = { bucket: 0, dir: 0, file: 1 };
    const val = (it) => (key === 'size' ? it.size ?? -1 : key === 'modified' ? it.modified || '' : key === 'type' ? it.content_type || '' : it.name);
    return S.items.slice().sort((a, b) => rank[a.kind] - rank[b.kind] || (val(a) < val(b) ? -dir : val(a) > val(b) ? dir : 0) || (a.name < b.name ? -1 : 1));
  }

  function render() {
    const rows = $('rows');
    rows.replaceChildren();
    for (const it of sorted()) rows.append(row(it));
    if (!S.items.length && !S.failed) {
      const msg = S.bucket === null ? (mode() === 'anon' ? 'No public buckets. Sign in to see yours.' : 'No buckets yet.') : S.search ? 'Nothing starts with that prefix.' : 'This folder is empty.';
      rows.append(el('tr', {}, el('td', { colspan: 5, class: 'empty' }, msg)));
    }
    document.querySelectorAll('th[aria-sort], th button[data-sort]').forEach((b) => b.closest('th').removeAttribute('aria-sort'));
    document.querySelector(`button[data-sort="${S.sort.key}"]`).closest('th').setAttribute('aria-sort', S.sort.dir > 0 ? 'ascending' : 'descending');
    const page = S.cursors.length;
    $('prev').disabled = page <= 1;
    $('next').disabled = !S.next;
    $('page').textContent = `Page ${page}`;
    $('pager').hidden = page <= 1 && !S.next;
    document.body.dataset.listed = String(S.items.length);
  }

  function row(it) {
    const size = it.kind === 'file' ? el('td', { class: 'num', 'data-size': it.size, title: `${it.size} bytes` }, human(it.size)) : el('td', { class: 'num' }, '—');
    const type = it.kind === 'file' ? it.content_type || '' : it.kind === 'dir' ? 'folder' : 'bucket';
    let name;
    const acts = el('td', { class: 'acts' });
    if (it.kind === 'bucket') {
      name = navLink(path(it.name, ''), it.name, { class: 'bucket' });
      if (canWrite()) acts.append(el('button', { type: 'button', class: 'danger', 'aria-label': `Delete bucket ${it.name}`, onclick: () => removeBucket(it.name) }, 'Delete'));
    } else if (it.kind === 'dir') {
      name = navLink(path(S.bucket, it.key), it.name, { class: 'dir' });
    } else if (dot(it.key)) {
      // Browsers drop such a segment from any URL: no request can name it.
      name = el('span', { class: 'file', title: 'A key of only dots: use an S3 client to read or delete it' }, it.name);
    } else {
      name = el('button', { type: 'button', class: 'link file', 'aria-label': `Preview ${it.name}`, onclick: () => preview(it) }, it.name);
      acts.append(...fileActions(it));
    }
    return el('tr', { 'data-key': it.key ?? it.name, 'data-kind': it.kind }, el('td', { class: 'name' }, name), size,
      el('td', { class: 'opt' }, when(it.modified)), el('td', { class: 'opt' }, type), acts);
  }

  function fileActions(it) {
    const href = () => objectUrl(it, { download: true });
    const dl = el('a', { href: href(), download: it.name.split('/').pop(), 'aria-label': `Download ${it.name}` }, 'Download');
    // A presigned link expires: it is signed again as it is used (a click
    // or Enter, a middle click, the context menu's "copy link"), not only
    // when the row was drawn.
    if (mode() === 'signed') for (const t of ['pointerdown', 'click', 'auxclick', 'contextmenu']) dl.addEventListener(t, () => { dl.href = href(); });
    const out = [
      dl,
      el('button', { type: 'button', 'aria-label': `Copy link to ${it.name}`, onclick: () => copyLink(it) }, 'Copy link'),
    ];
    if (canWrite()) out.push(el('button', { type: 'button', class: 'danger', 'aria-label': `Delete ${it.name}`, onclick: () => removeObject(it) }, 'Delete'));
    return out;
  }

  // `changed`: the store may have changed (or the page just opened), so
  // the totals are asked again; /_/stats walks the engine's files, too
  // costly for every click.
  async function load(changed = false) {
    const seq = ++S.seq;
    if (changed) stats();
    crumbs();
    const inBucket = S.bucket !== null, bucket = S.bucket;
    $('new-bucket').hidden = inBucket || !canWrite();
    $('new-folder').hidden = $('pick').hidden = !inBucket || !canWrite();
    $('search').disabled = !inBucket;
    try {
      const { items, next } = inBucket ? await listObjects(S.cursors[S.cursors.length - 1]) : await listBuckets();
      if (seq !== S.seq) return;
      // Each file acts on its own bucket, whatever the page shows later
      // (the Back button under an open preview).
      for (const it of items) it.bucket = bucket;
      S.items = items;
      S.next = next;
      S.failed = false;
      render();
    } catch (e) {
      if (seq !== S.seq) return;
      S.items = [];
      S.next = null;
      S.failed = true;
      render();
      say(`Could not list: ${e.message}`, true);
    }
  }

  async function stats() {
    const box = $('stats');
    if (!canWrite()) { box.hidden = true; return; }
    try {
      const s = await (await call('GET', '/_/stats')).json();
      // Signed out while it was asked: not for this page any more.
      if (!canWrite()) { box.hidden = true; return; }
      const cell = (label, value, key) => el('div', {}, el('dt', {}, label),
        el('dd', { 'data-stat': key, title: value ?? undefined }, key === 'objects' || key === 'engine' ? String(value ?? '—') : human(value)));
      box.replaceChildren(el('dl', { class: 'stats' },
        cell('Objects', s.objects, 'objects'), cell('Stored (logical)', s.logical_bytes, 'logical_bytes'),
        cell('On disk', s.disk_bytes, 'disk_bytes'), cell('Saved by dedup', s.dedup_saved_bytes, 'dedup_saved_bytes'), cell('Engine', s.engine, 'engine')));
      box.hidden = false;
    } catch (e) {
      box.hidden = true;
    }
  }

  // --- Navigation: real links, followed without reloading the page.
  function fromLocation() {
    const segs = location.pathname.split('/');
    const dec = (s) => { try { return decodeURIComponent(s); } catch { return s; } };
    S.bucket = segs[1] ? dec(segs[1]) : null;
    S.prefix = S.bucket === null ? '' : dec(segs.slice(2).join('/'));
    if (S.prefix && !S.prefix.endsWith('/')) S.prefix += '/';
    S.cursors = [null];
    S.search = '';
    $('search').value = '';
  }
  // `changed`: as for `load`.
  function go(href, changed = false) {
    history.pushState(null, '', href);
    fromLocation();
    say('');
    load(changed);
    $('main').focus({ preventScroll: true });
  }

  // --- Dialogs.
  function ask(title, text, fields = [], okLabel = 'OK') {
    const d = $('ask');
    $('ask-title').textContent = title;
    $('ask-text').textContent = text;
    $('ask-err').textContent = '';
    $('ask-ok').textContent = okLabel;
    $('ask-ok').className = okLabel === 'Delete' ? 'danger' : 'primary';
    const box = $('ask-fields');
    box.replaceChildren(...fields.map((f) => f.type === 'checkbox'
      ? el('label', {}, el('input', { type: 'checkbox', name: f.name }), ' ', f.label)
      : el('label', {}, f.label, el('input', { type: f.type || 'text', name: f.name, required: true, autocomplete: f.autocomplete || 'off', pattern: f.pattern, title: f.title }))));
    d.returnValue = '';
    d.showModal();
    (box.querySelector('input') || $('ask-ok')).focus();
    return new Promise((resolve) => {
      d.addEventListener('close', () => {
        if (d.returnValue !== 'ok') return resolve(null);
        const v = {};
        box.querySelectorAll('input').forEach((i) => { v[i.name] = i.type === 'checkbox' ? i.checked : i.value; });
        resolve(v);
      }, { once: true });
    });
  }

  async function removeObject(it) {
    if (!(await ask('Delete file', `Delete “${it.key}” from ${it.bucket}? This cannot be undone.`, [], 'Delete'))) return;
    try {
      await call('DELETE', path(it.bucket, it.key));
      if ($('preview').open) $('preview').close();
      say(`Deleted ${it.name}.`);
      load(true);
    } catch (e) { say(`Could not delete ${it.name}: ${e.message}`, true); }
  }
  async function removeBucket(name) {
    if (!(await ask('Delete bucket', `Delete the bucket “${name}”? Only an empty bucket can be deleted.`, [], 'Delete'))) return;
    try { await call('DELETE', path(name, '')); say(`Deleted bucket ${name}.`); load(true); } catch (e) { say(`Could not delete bucket ${name}: ${e.message}`, true); }
  }
  async function newBucket() {
    const fields = [{ name: 'name', label: 'Name', pattern: '[a-z0-9][a-z0-9.\\-]{1,61}[a-z0-9]', title: '3 to 63 lowercase letters, digits, dots and hyphens' }];
    if (S.cred) fields.push({ name: 'public', label: 'Public: anyone may read and list it without credentials', type: 'checkbox' });
    const v = await ask('New bucket', '', fields, 'Create');
    if (!v) return;
    try {
      if (v.public) await call('PUT', presign('PUT', path(v.name, '').slice(0, -1), {}, { 'x-amz-acl': 'public-read' }), { headers: { 'x-amz-acl': 'public-read' }, bearer: false });
      else await call('PUT', path(v.name, ''));
      go(path(v.name, ''), true);
      say(`Created bucket ${v.name}.`);
    } catch (e) { say(`Could not create bucket ${v.name}: ${e.message}`, true); }
  }
  async function newFolder() {
    const v = await ask('New folder', `A folder is kept as an empty object named “${S.prefix}name/”, so it stays even while it is empty.`, [{ name: 'name', label: 'Name' }], 'Create');
    const name = v && v.name.replace(/^\/+|\/+$/g, '');
    if (!name) return;
    try {
      await call('PUT', path(S.bucket, `${S.prefix}${name}/`), { body: '' });
      go(path(S.bucket, `${S.prefix}${name}/`), true);
      say(`Created folder ${name}.`);
    } catch (e) { say(`Could not create folder ${name}: ${e.message}`, true); }
  }
  async function copyLink(it) {
    const url = new URL(objectUrl(it, { expires: 7 * 24 * 3600 }), location.href).href;
    let ok = false;
    try { await navigator.clipboard.writeText(url); ok = true; } catch {
      const t = el('textarea', { class: 'offscreen' }, url);
      document.body.append(t);
      t.select();
      try { ok = document.execCommand('copy'); } catch { /* no clipboard at all */ }
      t.remove();
    }
    say(ok ? `Link copied${mode() === 'signed' ? ' (valid for 7 days)' : ''}: ${url}` : `Copy this link: ${url}`);
  }

  // --- Preview.
  const TEXTY = /^(text\/|application\/(json|xml|javascript|x-sh|toml|yaml|x-yaml))|\+(json|xml)$/;
  const TEXT_EXT = /\.(txt|md|log|csv|json|xml|ya?ml|toml|ini|conf|rs|py|js|ts|sh|c|h|go|java|html|css|sql)$/i;
  async function preview(it) {
    // Opening another preview (or closing this one) makes this one stale:
    // its answers, when they come, are dropped.
    const seq = ++S.shown, stale = () => seq !== S.shown;
    const d = $('preview'), body = $('pv-body'), meta = $('pv-meta');
    $('pv-title').textContent = it.name;
    body.replaceChildren(el('p', {}, 'Loading…'));
    meta.replaceChildren();
    $('pv-actions').replaceChildren(...fileActions(it));
    d.showModal();
    const p = path(it.bucket, it.key);
    let h;
    try { h = (await call('HEAD', p, { accept: '*/*' })).headers; } catch (e) {
      if (!stale()) body.replaceChildren(el('p', { class: 'err' }, `Could not read ${it.name}: ${e.message}`));
      return;
    }
    if (stale()) return;
    const type = h.get('content-type') || 'application/octet-stream', size = Number(h.get('content-length') || it.size);
    const pairs = [['Size', `${human(size)} (${size} bytes)`], ['Content type', type], ['ETag', (h.get('etag') || '').replace(/"/g, '')],
      ['SHA-256', h.get('x-depot-sha256') || '—'], ['Modified', when(h.get('last-modified'))]];
    meta.replaceChildren(...pairs.flatMap(([k, v]) => [el('dt', {}, k), el('dd', { 'data-meta': k }, v)]));
    const src = objectUrl(it);
    let view;
    if (type.startsWith('image/')) view = el('img', { src, alt: it.name });
    else if (type.startsWith('video/')) view = el('video', { src, controls: true, preload: 'metadata' });
    else if (type.startsWith('audio/')) view = el('audio', { src, controls: true, preload: 'metadata' });
    else if (TEXTY.test(type) || (type === 'application/octet-stream' && TEXT_EXT.test(it.name))) {
      try {
        // An empty file has no byte 0 to ask for: the server would answer 416.
        const text = size === 0 ? '' : await (await call('GET', p, { accept: '*/*', headers: { Range: 'bytes=0-65535' } })).text();
        view = el('pre', { tabindex: 0, 'aria-label': 'File contents' }, text);
        if (size > 65536) view = el('div', {}, view, el('p', {}, `Showing the first 64 KiB of ${human(size)}.`));
      } catch (e) { view = el('p', { class: 'err' }, e.message); }
    } else view = el('p', {}, 'No preview for this type of file.');
    if (stale()) return;
    body.replaceChildren(view);
  }

  // --- Uploads: each file is sent as it is read from disk (the File is the
  // request body), a few at a time.
  const queue = [];
  let running = 0;
  function upload(files) {
    if (S.bucket === null || !canWrite()) { say('Open a bucket (and sign in) to upload.', true); return; }
    for (const file of files) {
      const bar = el('progress', { max: file.size || 1, value: 0, 'aria-label': `Upload of ${file.name}` });
      const state = el('span', {}, 'waiting');
      const li = el('li', { 'data-name': file.name }, el('span', { class: 'name' }, file.name), bar, state);
      $('uploads').append(li);
      queue.push({ file, key: S.prefix + file.name, bucket: S.bucket, bar, state, li });
    }
    pump();
  }
  /** The files of a drop, and the names of the folders in it: a folder
   * comes as a File that cannot be read. */
  function dropped(dt) {
    const files = [], folders = [];
    if (!dt) return { files, folders };
    for (const item of Array.from(dt.items || [])) {
      if (item.kind !== 'file') continue;
      const entry = item.webkitGetAsEntry?.();
      if (entry?.isDirectory) folders.push(entry.name);
      else { const f = item.getAsFile(); if (f) files.push(f); }
    }
    return { files, folders };
  }
  function pump() {
    while (running < 3 && queue.length) {
      running++;
      send(queue.shift()).then(() => {
        running--;
        pump();
        if (!running) load(true);
      });
    }
  }
  function send(job) {
    return new Promise((resolve) => {
      const x = new XMLHttpRequest();
      x.open('PUT', path(job.bucket, job.key));
      if (S.cred) x.setRequestHeader('Authorization', 'Bearer ' + S.cred.sk);
      if (job.file.type) x.setRequestHeader('Content-Type', job.file.type);
      x.setRequestHeader('Accept', 'application/json');
      job.state.textContent = 'uploading';
      x.upload.onprogress = (e) => {
        if (e.lengthComputable) { job.bar.max = e.total || 1; job.bar.value = e.loaded; job.state.textContent = `${Math.floor((100 * e.loaded) / (e.total || 1))}%`; }
      };
      const fail = (msg) => { job.state.textContent = `failed: ${msg}`; job.state.className = 'failed'; job.li.dataset.state = 'failed'; say(`Upload of ${job.file.name} failed: ${msg}`, true); resolve(); };
      // loadend follows every end, an abort or a timeout too: the job always
      // ends, and the queue goes on. Status 0: no answer came.
      x.onloadend = async () => {
        if (x.status === 0) return fail('the connection failed');
        if (x.status >= 300) return fail(await failure(x.status, x.statusText, x.responseText));
        job.bar.value = job.bar.max;
        job.state.textContent = 'done';
        job.state.className = 'done';
        job.li.dataset.state = 'done';
        resolve();
      };
      x.send(job.file);
    });
  }

  // --- Sign-in.
  async function signIn(why = 'This server needs credentials. Cancel to browse the public buckets only.') {
    for (;;) {
      const v = await ask('Sign in', why, [
        { name: 'ak', label: 'Access key', autocomplete: 'username' }, { name: 'sk', label: 'Secret key', type: 'password', autocomplete: 'current-password' }], 'Sign in');
      if (!v) return;
      S.cred = { ak: v.ak, sk: v.sk };
      const r = await verify();
      if (r && r.ok) break;
      S.cred = null;
      say(r ? `Sign-in refused: ${await failure(r.status, r.statusText, await r.text())}` : 'The server could not be reached.', true);
    }
    sessionStorage.setItem('depot.cred', JSON.stringify(S.cred));
    say(`Signed in as ${S.cred.ak}.`);
    who();
    load(true);
  }
  function who() {
    const b = $('sign');
    b.hidden = !S.cfg.auth_required;
    b.textContent = S.cred ? 'Sign out' : 'Sign in';
    $('who').textContent = !S.cfg.auth_required ? '' : S.cred ? `Signed in as ${S.cred.ak}` : 'Anonymous: public buckets only';
  }

  async function start() {
    // Without its settings the page cannot tell whether to ask for
    // credentials: it stops rather than guess.
    try { S.cfg = await (await call('GET', '/_/ui/config')).json(); } catch (e) { say(`The page could not start: ${e.message}`, true); return; }
    try { S.cred = JSON.parse(sessionStorage.getItem('depot.cred') || 'null'); } catch { S.cred = null; }
    if (!S.cfg.auth_required) S.cred = null;
    document.addEventListener('click', (e) => {
      const a = e.target.closest('a[data-nav]');
      if (a && !e.ctrlKey && !e.metaKey && !e.shiftKey && e.button === 0) { e.preventDefault(); go(a.getAttribute('href')); }
    });
    window.addEventListener('popstate', () => {
      if ($('preview').open) $('preview').close();
      fromLocation();
      load();
    });
    document.querySelectorAll('button[data-sort]').forEach((b) => b.addEventListener('click', () => {
      const key = b.dataset.sort;
      S.sort = { key, dir: S.sort.key === key ? -S.sort.dir : 1 };
      render();
    }));
    $('prev').onclick = () => { S.cursors.pop(); load(); };
    // Cleared at once: a second click before the page comes would push the
    // same cursor again.
    $('next').onclick = () => {
      if (!S.next) return;
      S.cursors.push(S.next);
      S.next = null;
      $('next').disabled = true;
      load();
    };
    let timer;
    $('search').addEventListener('input', () => {
      clearTimeout(timer);
      timer = setTimeout(() => { S.search = $('search').value; S.cursors = [null]; load(); }, 200);
    });
    $('new-bucket').onclick = newBucket;
    $('new-folder').onclick = newFolder;
    $('files').addEventListener('change', (e) => { upload(Array.from(e.target.files)); e.target.value = ''; });
    $('pv-close').onclick = () => $('preview').close();
    $('preview').addEventListener('close', () => { S.shown++; $('pv-body').replaceChildren(); });
    $('sign').onclick = () => {
      if (!S.cred) return signIn();
      S.cred = null;
      sessionStorage.removeItem('depot.cred');
      who();
      go('/', true);
    };
    let depth = 0;
    document.addEventListener('dragenter', (e) => { if (e.dataTransfer?.types.includes('Files')) { depth++; document.body.classList.add('dragging'); } });
    document.addEventListener('dragleave', () => { if (--depth <= 0) { depth = 0; document.body.classList.remove('dragging'); } });
    document.addEventListener('dragover', (e) => e.preventDefault());
    document.addEventListener('drop', (e) => {
      e.preventDefault();
      depth = 0;
      document.body.classList.remove('dragging');
      const { files, folders } = dropped(e.dataTransfer);
      if (files.length) upload(files);
      if (folders.length) say(`Folders cannot be uploaded (${folders.join(', ')}): drop the files in them instead.`, true);
    });
    fromLocation();
    who();
    load(true);
    if (S.cfg.auth_required && !S.cred) signIn();
  }
  start();
})();
