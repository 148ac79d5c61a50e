// The features dashboard (anatomy_cli/output/html/features.py). D: the command's JSON record (features, contexts,
// logits, edges), written by the page. Every piece of user or model text goes in with textContent, never as HTML.
// Unpack the page's packed rows (features.py page_data): each context and logit effect back into an object.
// A context's tokens are read from its window's (each corpus window's shown tokens stored once).
D.contexts = D.contexts.map(function (c) {
  return {feature: c[0], kind: c[1] ? "quantile" : "top", rank: c[2], quantile: c[3], lower: c[4], upper: c[5],
          activation: c[6], at: c[7], activations: c[10],
          tokens: D.windows[c[8]].slice(c[9], c[9] + c[10].length).map(function (i) { return D.pieces[i]; })};
});
D.features.forEach(function (r) {  // co-firing as [feature, tokens]: the fraction of the feature's own firing tokens
  if (r.cooccurring) r.cooccurring = r.cooccurring.map(function (p) {
    return {feature: p[0], tokens: p[1], fraction: r.fires ? p[1] / r.fires : 0};
  });
});
D.logits = D.logits.map(function (l) {
  return {feature: l[0], side: l[1] ? "bottom" : "top", rank: l[2], token: D.pieces[l[3]], effect: l[4]};
});
var byId = {}, ctxs = {}, logits = {}, expl = {};
// explain's rows (output/views/explain.py rows: description, scores, control_*), where the page has them.
(D.explanations || []).forEach(function (e) { expl[e.feature] = e; });
D.features.forEach(function (r) { byId[r.feature] = r; ctxs[r.feature] = []; logits[r.feature] = []; });
D.contexts.forEach(function (c) { if (ctxs[c.feature]) ctxs[c.feature].push(c); });
D.logits.forEach(function (l) { if (logits[l.feature]) logits[l.feature].push(l); });
function el(tag, text, cls) {
  var e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}
function vis(t) { return String(t).replace(/\n/g, "\u21b5").replace(/\t/g, "\u2192"); }
function score(x) { return x === null || x === undefined ? "\u2013" : Number(x).toFixed(2); }
function num(x, d) { return x === null || x === undefined ? "\u2013" : Number(x).toPrecision(d || 4); }
function promoted(f) {
  return logits[f].filter(function (l) { return l.side === "top" && l.rank < 3; })
    .map(function (l) { return vis(l.token); }).join(" ");
}
// Search text of a feature: its explanation, its promoted/suppressed tokens and its contexts' tokens, lower case.
var hay = {};
D.features.forEach(function (r) {
  var parts = logits[r.feature].map(function (l) { return l.token; });
  if (expl[r.feature]) parts.push(expl[r.feature].description);
  ctxs[r.feature].forEach(function (c) { parts.push(c.tokens.join("")); });
  hay[r.feature] = parts.join("\n").toLowerCase();
});
var search = document.getElementById("fx-search"), sort = document.getElementById("fx-sort");
var tbody = document.querySelector("#fx-list tbody"), count = document.getElementById("fx-count");
var panel = document.getElementById("fx-panel"), current = null;
function shown() {
  var q = search.value.trim().toLowerCase(), key = sort.value;
  var rows = D.features.filter(function (r) {
    if (!q) return true;
    if (/^\d+$/.test(q)) return String(r.feature) === q;
    return hay[r.feature].indexOf(q) >= 0;
  });
  function value(r) {  // a score (explain's rows) or a statistic; none: below every value
    var v = key in r ? r[key] : (expl[r.feature] || {})[key];
    return v === null || v === undefined ? -Infinity : v;
  }
  rows.sort(function (a, b) {
    if (key === "feature") return a.feature - b.feature;
    var va = value(a), vb = value(b);
    return (va === vb ? 0 : vb > va ? 1 : -1) || (a.feature - b.feature);  // the largest first; ties: the lower id
  });
  return rows;
}
function drawList() {
  var rows = shown();
  tbody.textContent = "";
  rows.forEach(function (r) {
    var tr = el("tr");
    tr.dataset.feature = r.feature;
    if (r.feature === current) tr.className = "sel";
    var cells = [r.feature, num(r.frequency, 3), num(r.max_activation), num(r.mean_activation), r.status];
    if (D.explanations) {  // the scores and the explanation before the promoted tokens (features.py's header)
      var e = expl[r.feature] || {};
      cells.push(score(e.detection_balanced_accuracy), score(e.fuzz_balanced_accuracy), e.description || "");
    }
    cells.push(promoted(r.feature));
    cells.forEach(function (v, i) {
      var td = el("td", v, i < 4 || (D.explanations && (i === 5 || i === 6)) ? "num" :
                  (i === 4 && v ? "status-" + v : ""));
      td.title = i >= 5 ? v : "";
      tr.appendChild(td);
    });
    tr.addEventListener("click", function () { location.hash = "f-" + r.feature; });
    tbody.appendChild(tr);
  });
  count.textContent = rows.length + " of " + D.features.length + " features";
}
function context(c, max) {
  var p = el("div", null, "ctx");
  p.dataset.kind = c.kind; p.dataset.rank = c.rank;
  p.appendChild(el("b", num(c.activation) + " "));
  c.tokens.forEach(function (t, i) {
    var a = c.activations[i], s = el("span", vis(t), "tok" + (i === c.at ? " at" : ""));
    s.dataset.act = String(a);
    s.title = JSON.stringify(t) + ": " + a;
    if (max > 0 && a > 0) s.style.background = "rgba(255,120,0," + Math.min(1, a / max).toFixed(3) + ")";
    p.appendChild(s);
  });
  return p;
}
function effects(f, side, title) {
  var box = el("div"), t = el("table", null, "data");
  box.appendChild(el("h3", title));
  t.dataset.side = side;
  logits[f].filter(function (l) { return l.side === side; }).forEach(function (l) {
    var tr = el("tr");
    tr.appendChild(el("td", vis(l.token)));
    tr.appendChild(el("td", l.effect.toFixed(4), "num"));
    t.appendChild(tr);
  });
  box.appendChild(t);
  return box;
}
function histogram(r, div) {
  var h = r.histogram, lo = h.findIndex(function (n) { return n > 0; }), hi = h.length - 1;
  while (hi > 0 && h[hi] === 0) hi--;
  var x = [], y = [];
  for (var j = lo; j <= hi; j++) {  // a firing feature's (a dead one has no plot: show)
    // bin j is [edges[j], edges[j + 1]) (edges: 0 first, null for infinity last; docs/commands/features.md)
    x.push(j === 0 ? "(0, " + num(D.edges[1], 3) + ")" : "[" + num(D.edges[j], 3) + ", " +
      (D.edges[j + 1] === null ? "\u221e" : num(D.edges[j + 1], 3)) + ")");
    y.push(h[j]);
  }
  Plotly.react(div, [{type: "bar", x: x, y: y, marker: {color: "#e07000"},
                      hovertemplate: "activation in %{x}<br>%{y} tokens<extra></extra>"}],
               {template: "simple_white", font: {family: D.font, size: 12}, height: 260,
                width: Math.max(320, Math.min(640, div.clientWidth || 640)),  // the panel's width: no page scroll
                margin: {l: 60, r: 20, t: 30, b: 80},  // automargin: room for the last slanted bin label
                xaxis: {title: {text: "activation (log-spaced bins)"}, automargin: true},
                yaxis: {title: {text: "tokens"}, automargin: true}}, D.config);
}
// The explanation and its scores: detection and fuzzing (balanced accuracy, F1), its own and the control's.
function explanation(e) {
  var box = el("div");
  box.id = "fx-explanation";
  box.appendChild(el("p", e.description, "explanation"));
  var t = el("table", null, "data"), head = el("tr");
  t.id = "fx-scores";
  ["", "detection", "detection F1", "fuzzing", "fuzzing F1"].forEach(function (h) { head.appendChild(el("th", h)); });
  t.appendChild(head);
  [["", "its explanation"], ["control_", e.control_of === null || e.control_of === undefined ? "control" :
    "control (#" + e.control_of + "'s explanation)"]].forEach(function (p) {
    var tr = el("tr");
    tr.dataset.scores = p[0] ? "control" : "own";
    tr.appendChild(el("td", p[1]));
    ["detection_balanced_accuracy", "detection_f1", "fuzz_balanced_accuracy", "fuzz_f1"].forEach(function (k) {
      tr.appendChild(el("td", score(e[p[0] + k]), "num"));
    });
    t.appendChild(tr);
  });
  box.appendChild(t);
  return box;
}
function cofiring(r) {
  var p = el("p");
  (r.cooccurring || []).forEach(function (c) {
    var a = el(byId[c.feature] ? "a" : "span", "#" + c.feature);
    if (byId[c.feature]) a.href = "#f-" + c.feature;
    p.appendChild(a);
    p.appendChild(document.createTextNode(" (" + c.tokens + " tokens, " + (100 * c.fraction).toFixed(1) + "%)  "));
  });
  if (!p.childNodes.length) p.textContent = "none counted";
  return p;
}
function show(f) {
  var r = byId[f];
  if (!r) return;
  current = f;
  var old = document.getElementById("fx-hist");
  if (old) Plotly.purge(old);
  panel.textContent = "";
  var h = el("h2", "feature " + f + " ");
  h.id = "f-" + f;  // the panel's anchor: features.html#f-ID (circuit --plot links here)
  if (r.status) h.appendChild(el("span", r.status, "status-" + r.status));
  panel.appendChild(h);
  // the browser scrolls an address's #f-ID heading to the window's top (on load, after this script): its margin
  // puts the page's top there instead, the title and controls in view (the panel starts beside the list)
  h.style.scrollMarginTop = (h.getBoundingClientRect().top + window.scrollY) + "px";
  if (expl[f]) panel.appendChild(explanation(expl[f]));
  if (r.fires === 0) {  // dead: nothing to draw, an empty plot said nothing (a new user's trial)
    var never = el("p", "never fired on " + D.tokens.toLocaleString("en-US") + " tokens", "never");
    never.id = "fx-never";
    panel.appendChild(never);
  } else {
    panel.appendChild(el("p", "fires at " + r.fires + " tokens (frequency " + num(r.frequency, 3) + "), mean " +
      num(r.mean_activation) + ", max " + num(r.max_activation)));
    var hist = el("div");
    hist.id = "fx-hist";
    panel.appendChild(hist);
    histogram(r, hist);
  }
  panel.appendChild(el("h3", "top-activating contexts"));
  var top = el("div");
  top.id = "fx-top";
  ctxs[f].filter(function (c) { return c.kind === "top"; }).forEach(function (c) {
    top.appendChild(context(c, r.max_activation));
  });
  panel.appendChild(top);
  var q = el("div");
  q.id = "fx-quantile";
  var last = null;
  ctxs[f].filter(function (c) { return c.kind === "quantile"; }).forEach(function (c) {
    if (c.quantile !== last) {
      q.appendChild(el("h3", "interval " + c.quantile + ": [" + num(c.lower) + ", " + num(c.upper) + "]"));
      last = c.quantile;
    }
    q.appendChild(context(c, r.max_activation));
  });
  panel.appendChild(q);
  var fx = el("div", null, "fx-wrap");
  fx.appendChild(effects(f, "top", "promotes"));
  fx.appendChild(effects(f, "bottom", "suppresses"));
  panel.appendChild(fx);
  panel.appendChild(el("h3", "fires together with"));
  panel.appendChild(cofiring(r));
  mark();
}
// The picked row marked in place: the list is not drawn again (thousands of rows).
function mark() {
  [].forEach.call(tbody.rows, function (tr) { tr.className = +tr.dataset.feature === current ? "sel" : ""; });
}
// The panel of #f-ID: drawn, and the page at its top (the title and controls in view; the panel starts beside the
// list).
function fromHash() {
  var m = /^#f-(\d+)$/.exec(location.hash);
  if (m && byId[+m[1]]) { show(+m[1]); window.scrollTo(0, 0); return true; }
  return false;
}
search.addEventListener("input", drawList);
sort.addEventListener("change", drawList);
window.addEventListener("hashchange", fromHash);
drawList();
if (!fromHash() && D.features.length) show(shown()[0].feature);
