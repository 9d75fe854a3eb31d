// The history page's script (pytest_syncguard/render/page.py writes it into each page): the tests' index, the
// search, and each chart drawn on its canvas from the page's data when it scrolls into view.
const D = JSON.parse(document.getElementById('data').textContent);
const W = 480, H = 150, L = 64, R = 10, T = 10, B = 34;
const tip = document.getElementById('tip');
const fmt = v => Math.abs(v) >= 1e5 || (Math.abs(v) < 1e-3 && v !== 0) ? v.toExponential(3) : +v.toPrecision(5) + '';
const run = n => D.runs[n - D.first];
const rows = c => { const out = []; let a = c.first; const v = q => c.base + q * c.step;
  c.ends.forEach((z, i) => { out.push([a, z, v(c.lo[i]), v(c.hi[i]), v(c.last[i])]); a = z + 1; }); return out; };
const lastOf = c => c.base + c.last[c.last.length - 1] * c.step;
const el = (tag, text) => { const e = document.createElement(tag); if (text !== undefined) e.textContent = text; return e; };
function draw(canvas, chart) {
  const g = canvas.getContext('2d'), bs = rows(chart);
  let lo = Math.min(...bs.map(b => b[2])), hi = Math.max(...bs.map(b => b[3]));
  if (hi === lo) { hi += Math.abs(hi) * 0.01 || 1; lo -= Math.abs(lo) * 0.01 || 1; }
  const x0 = D.first, x1 = D.first + D.runs.length - 1 || 1;
  const x = n => L + (W - L - R) * (x1 === x0 ? 0.5 : (n - x0) / (x1 - x0));
  const y = v => T + (H - T - B) * (1 - (v - lo) / (hi - lo));
  g.font = '11px sans-serif'; g.fillStyle = '#444'; g.strokeStyle = '#ccc';
  for (const v of [lo, (lo + hi) / 2, hi]) {
    g.beginPath(); g.moveTo(L, y(v)); g.lineTo(W - R, y(v)); g.stroke();
    g.textAlign = 'right'; g.fillText(fmt(v), L - 4, y(v) + 4);
  }
  g.textAlign = 'left'; g.fillText((run(x0) || [])[1] || '', L, H - 6);
  g.textAlign = 'right'; g.fillText((run(x1) || [])[1] || '', W - R, H - 6);
  g.textAlign = 'left'; g.fillText('run ' + x0, L, H - 20); g.textAlign = 'right'; g.fillText('run ' + x1, W - R, H - 20);
  g.strokeStyle = '#e0a040'; g.lineWidth = 2;
  for (const [a, b, m] of chart.levels) { g.beginPath(); g.moveTo(x(a), y(m)); g.lineTo(Math.max(x(b), x(a) + 1), y(m)); g.stroke(); }
  g.lineWidth = 1; g.strokeStyle = '#1f6feb'; g.fillStyle = '#1f6feb';
  for (const b of bs) {
    const cx = x(b[1]);
    g.beginPath(); g.moveTo(cx, y(b[2])); g.lineTo(cx, y(b[3])); g.stroke();
    g.fillRect(cx - 1.5, y(b[4]) - 1.5, 3, 3);
  }
  const at = e => { const r = canvas.getBoundingClientRect(), px = (e.clientX - r.left) * W / r.width;
    let best = null, d = 1e9; for (const b of bs) { const dd = Math.abs(x(b[1]) - px); if (dd < d) { d = dd; best = b; } } return best; };
  canvas.onmousemove = e => { const b = at(e); if (!b) return; const a = run(b[0]) || [], z = run(b[1]) || [];
    tip.textContent = (b[0] === b[1] ? 'run ' + b[0] : 'runs ' + b[0] + ' to ' + b[1]) + '\n' + chart.metric + ': ' +
      (b[2] === b[3] ? fmt(b[2]) : fmt(b[2]) + ' to ' + fmt(b[3]) + ', last ' + fmt(b[4])) + ' ' + chart.unit +
      '\n' + (b[0] === b[1] ? '' : a[0] + ' (' + a[1] + ') to\n') + z[0] + ' (' + z[1] + ') on ' + D.hosts[z[2]];
    tip.style.left = (e.clientX + 12) + 'px'; tip.style.top = (e.clientY + 12) + 'px'; tip.hidden = false; };
  canvas.onmouseleave = () => { tip.hidden = true; };
  canvas.onclick = e => { const b = at(e), r = b && run(b[1]); if (r && D.commit_url) window.open(D.commit_url + r[0], '_blank', 'noopener'); };
}
const once = cv => { if (!cv.drawn) { cv.drawn = true; seen.unobserve(cv); draw(cv, cv.chart); } };
const seen = new IntersectionObserver(entries => { for (const e of entries) if (e.isIntersecting) once(e.target); });
const trs = [], sections = [], body = document.querySelector('#index tbody'), box = document.getElementById('tests');
D.tests.forEach((t, i) => {
  const s = el('section'); s.id = 't' + i; const h = el('h2', t.id); s.append(h);
  for (const c of t.charts) {
    const f = el('figure'), cv = el('canvas'); cv.width = W; cv.height = H; cv.chart = c;
    f.append(cv, el('figcaption', c.metric + (c.unit ? ' (' + c.unit + ')' : '') + ': last ' + fmt(lastOf(c)) + ', ' +
      c.runs + ' runs' + (c.levels.length ? ', ' + c.levels.length + (c.levels.length === 1 ? ' level' : ' levels') : ', a count: judged exactly')));
    s.append(f); seen.observe(cv);
  }
  const steady = Object.entries(t.steady);
  if (steady.length) s.append(el('p', 'the same in every run: ' + steady.map(([k, v]) => k + ' ' + fmt(v)).join(', ')));
  box.append(s); sections.push(s);
  const tr = el('tr'), a = el('a', t.id); a.href = '#t' + i; const td = el('td'); td.append(a);
  const dt = t.charts.find(c => c.metric === D.time_metric);
  tr.append(td, el('td', dt ? fmt(lastOf(dt)) : ''), el('td', dt ? dt.levels.length + '' : ''));
  body.append(tr); trs.push(tr);
});
const shown = document.getElementById('shown');
const filter = () => { const q = document.getElementById('search').value.toLowerCase(); let n = 0;
  D.tests.forEach((t, i) => { const hit = t.id.toLowerCase().includes(q); trs[i].hidden = !hit; sections[i].hidden = !hit; n += hit; });
  shown.textContent = n + ' of ' + D.tests.length + ' tests'; };
document.getElementById('search').oninput = filter; filter();
for (const cv of document.querySelectorAll('canvas')) {  // the first screen drawn before the first frame
  const r = cv.getBoundingClientRect(); if (r.top > innerHeight) break; if (r.bottom > 0) once(cv); }
