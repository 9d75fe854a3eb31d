// The history page's script (pytest_syncguard/render/page.py writes it into each page, after uPlot): the tests'
// index, the search, and each chart drawn with uPlot from the page's data when it scrolls into view.
const D = JSON.parse(document.getElementById('data').textContent);
const W = 520, H = 220;
const tip = document.getElementById('tip');
const fmt = v => Math.abs(v) >= 1e5 || (Math.abs(v) < 1e-3 && v !== 0) ? v.toExponential(3) : +v.toPrecision(5) + '';
const run = n => D.runs[n - D.first];
const rows = c => { const out = []; let a = c.first; const v = q => c.base + q * c.step;
  c.ends.forEach((z, i) => { out.push([a, z, v(c.lo[i]), v(c.hi[i]), v(c.last[i])]); a = z + 1; }); return out; };
const lastOf = c => c.base + c.last[c.last.length - 1] * c.step;
const el = (tag, text) => { const e = document.createElement(tag); if (text !== undefined) e.textContent = text; return e; };
// Each chart is a uPlot (vendored: render/vendor): the buckets' lowest to highest as a band, each bucket's last run
// as a point on a line (a count's as steps), the level each run was judged against as a stepped line; drag to zoom
// into runs, double-click to zoom out, hover for the bucket's runs, click for its last commit.
const BAND = 'rgba(31,111,235,0.18)', LINE = '#1f6feb', LEVEL = '#e0a040';
function draw(box, chart) {
  const bs = rows(chart), xs = bs.map(b => b[1]);
  const level = xs.map(n => { const l = chart.levels.find(([a, z]) => a <= n && n <= z); return l ? l[2] : null; });
  const count = !chart.levels.length;
  const day = n => ((run(Math.round(n)) || [])[1] || '').slice(0, 10);
  const opts = {
    width: W, height: H, legend: {show: false}, scales: {x: {time: false}},
    cursor: {drag: {x: true, y: false}, points: {size: 7}},
    axes: [
      {label: 'run, date', space: 90, size: 54, values: (u, ticks) => ticks.map(n => Number.isInteger(n) ? n + '\n' + day(n) : '')},
      {label: chart.unit || chart.metric, values: (u, ticks) => ticks.map(fmt), size: 64},
    ],
    series: [
      {},
      {stroke: BAND, points: {show: false}},
      {stroke: BAND, points: {show: false}},
      {stroke: LINE, width: 1.5, points: {show: bs.length <= 120, size: 4}, paths: count ? uPlot.paths.stepped({align: -1}) : undefined},
      {stroke: LEVEL, width: 2, points: {show: false}, paths: uPlot.paths.stepped({align: 1})},
    ],
    bands: [{series: [2, 1], fill: BAND}],
    hooks: {setCursor: [u => {
      const i = u.cursor.idx; if (i == null || u.cursor.left < 0) { tip.hidden = true; return; }
      const b = bs[i], a = run(b[0]) || [], z = run(b[1]) || [], r = u.over.getBoundingClientRect();
      tip.textContent = (b[0] === b[1] ? 'run ' + b[0] : 'runs ' + b[0] + ' to ' + b[1]) + '\n' + chart.metric + ': ' +
        (b[2] === b[3] ? fmt(b[2]) : fmt(b[2]) + ' to ' + fmt(b[3]) + ', last ' + fmt(b[4])) + ' ' + chart.unit +
        (level[i] == null ? '' : '\nlevel ' + fmt(level[i])) +
        '\n' + (b[0] === b[1] ? '' : a[0] + ' (' + a[1] + ') to\n') + z[0] + ' (' + z[1] + ') on ' + D.hosts[z[2]];
      tip.style.left = (r.left + u.cursor.left + 14) + 'px'; tip.style.top = (r.top + u.cursor.top + 14) + 'px';
      tip.hidden = false;
    }]},
  };
  const plot = new uPlot(opts, [xs, bs.map(b => b[2]), bs.map(b => b[3]), bs.map(b => b[4]), level], box);
  let down = null;
  plot.over.addEventListener('mousedown', e => { down = [e.clientX, e.clientY]; });
  plot.over.addEventListener('mouseleave', () => { tip.hidden = true; });
  plot.over.addEventListener('click', e => {  // a click, not the end of a drag that zoomed
    if (!down || Math.abs(e.clientX - down[0]) + Math.abs(e.clientY - down[1]) > 3) return;
    const i = plot.cursor.idx, r = i == null ? null : run(bs[i][1]);
    if (r && D.commit_url) window.open(D.commit_url + r[0], '_blank', 'noopener');
  });
}
const once = cv => { if (!cv.drawn) { cv.drawn = true; seen.unobserve(cv); draw(cv, cv.chart); } };
const seen = new IntersectionObserver(entries => { for (const e of entries) if (e.isIntersecting) once(e.target); });
const trs = [], sections = [], body = document.querySelector('#index tbody'), box = document.getElementById('tests');
D.tests.forEach((t, i) => {
  const s = el('section'); s.id = 't' + i; const h = el('h2', t.id); s.append(h);
  for (const c of t.charts) {
    const f = el('figure'), cv = el('div'); cv.className = 'chart'; cv.chart = c;
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
for (const cv of document.querySelectorAll('div.chart')) {  // the first screen drawn before the first frame
  const r = cv.getBoundingClientRect(); if (r.top > innerHeight) break; if (r.bottom > 0) once(cv); }
