/* The site's figures fit the width they are drawn at (issue 28, item 7).

`viz.fit_figure` wraps a figure's titles for a 640 px text column (`viz.COLUMN_PX`) and gives them a top margin under
plotly's toolbar; the site's column narrows to about 360 px (a 992 px window with the sidebar docked). This script, loaded
by every page after plotly.js (`nbs/_quarto.yml`), fits each plotly figure to the width it really has, on load and whenever
the figure's width changes, with one `Plotly.relayout` of the figure's layout (`Plotly.update` where legend entries are
renamed):
- the title, the subplot titles, the axis titles and an animation's frame titles are re-wrapped at spaces to the room they
  have (measured with their font), in lines of even length; where the page's text fits, it is put back as the page wrote it;
- subplot titles whose words cannot fit, or that would take more than 3 lines, get a smaller font (a row alike), and so do
  other annotations (a diagram's labels) that stick out of the figure;
- a title goes where viz.fit_figure puts one (its middle under the toolbar) when it wraps, reaches under the toolbar or the
  toolbar itself wraps; the top margin holds the toolbar, the title, the subplot titles and a legend above the plot, and
  the figure grows by what the margin grew, so the plot keeps its height;
- a legend beside the plot whose entries would leave the plot less than about half the figure has its entries wrapped.
Nothing is changed where everything fits. A figure in the middle of an animation is fitted when the animation ends; a
title that the page sets later (a live editor's loss, the construction playground's block) is fitted in turn. What the
page wrote is kept in `gd._stFit`. */
(function () {
  'use strict';
  if (window.stFit) return;
  var TOOLBAR_PX = 30,   // viz.TOOLBAR_PX: the toolbar's height and a gap
      LINE_EM = 1.3,     // viz.LINE_EM: one line of text, in font sizes
      SIDE_PX = 10,      // room kept between a title and the figure's edge
      SUB_PX = 8;        // room kept between two subplot titles

  var ctx = null;
  function measure(text, px, family, bold) {
    ctx = ctx || document.createElement('canvas').getContext('2d');
    ctx.font = (bold ? 'bold ' : '') + px + 'px ' + (family || 'sans-serif');
    return ctx.measureText(text.replace(/&[#\w]+;/g, 'x')).width;   // an entity is one character
  }

  var TAG = /(<[^<>]*>)/, BR = /^<br(\s[^>]*)?\/?>$/i;
  function nLines(text) { return text ? String(text).split(/<br(?:\s[^>]*)?\/?>/i).length : 0; }
  function wrappedByViz(text) {   // viz.wrap_text wraps only text without tags: its breaks are the only tags there
    return !/<(?!br[\s\/>])[^<>]*>/i.test(text);
  }

  /* Break plotly text at spaces into lines no wider than `room` px; tags stay open across a break (closed at the end of a
     line, opened again on the next). With `join`, its `<br>`s are spaces first (lines that viz.wrap_text broke for a
     wider figure). Returns {text, lines, widest}: widest is the widest line in px. */
  function wrap(text, room, font, join) {
    var src = join ? String(text).split(/<br(?:\s[^>]*)?\/?>/i).join(' ') : String(text);
    var out = [], line = '', w = 0, widest = 0, open = [], empty = true;
    function name(tag) { var m = /^<\/?\s*(\w+)/.exec(tag); return m ? m[1].toLowerCase() : ''; }
    function style() {
      var bold = false, scale = 1;
      open.forEach(function (t) { var k = name(t); if (k === 'b') bold = true; if (k === 'sup' || k === 'sub') scale = 0.7; });
      return {bold: bold, px: font.size * scale};
    }
    function end() {
      out.push(line + open.slice().reverse().map(function (t) { return '</' + name(t) + '>'; }).join(''));
      widest = Math.max(widest, w); line = open.join(''); w = 0; empty = true;
    }
    src.split(TAG).forEach(function (piece, i) {
      if (i % 2) {   // a tag
        if (BR.test(piece)) end();
        else if (/^<\//.test(piece)) { open.pop(); line += piece; }
        else if (/\/>$/.test(piece)) line += piece;
        else { open.push(piece); line += piece; }
        return;
      }
      piece.split(' ').forEach(function (word, j) {
        var s = style(), ww = measure(word, s.px, font.family, s.bold), sp = j ? measure(' ', s.px, font.family, s.bold) : 0;
        if (j && !empty && w + sp + ww > room) { end(); line += word; w = ww; }
        else { line += (j ? ' ' : '') + word; w += sp + ww; }
        if (word) empty = false;
      });
    });
    out.push(line); widest = Math.max(widest, w);
    return {text: out.join('<br>'), lines: out.length, widest: widest};
  }

  /* `text` as the page wrote it where every line fits `room`; otherwise wrapped to it, in lines of even length (the
     narrowest width that needs no more lines). Returns {text, lines, widest}. */
  function fitText(text, room, font) {
    var asIs = wrap(text, Infinity, font, false);
    if (asIs.widest <= room) return {text: text, lines: asIs.lines, widest: asIs.widest};
    var join = wrappedByViz(text), best = wrap(text, room, font, join), lo = 0, hi = room;
    for (var k = 0; k < 10 && hi - lo > 2; k++) {
      var mid = (lo + hi) / 2, w = wrap(text, mid, font, join);
      if (w.lines <= best.lines && w.widest <= room) { hi = mid; best = w; } else lo = mid;
    }
    return best;
  }

  function fontOf(f, size) { return {size: (f && f.size) || size || 12, family: (f && f.family) || 'sans-serif'}; }
  function textOf(t) { return t == null ? '' : typeof t === 'string' ? t : (t.text || ''); }
  function busy(gd) {   // an animation plays: its frames own the figure until it ends
    var td = gd._transitionData;
    return !!(gd._transitioning || (td && ((td._frameQueue && td._frameQueue.length) || td._animationRaf)));
  }

  function toolbarBottom(gd) {   // px from the figure's top to under plotly's toolbar (a second row at narrow widths)
    var mb = gd.querySelector('.modebar');
    if (!mb || (gd._context && gd._context.displayModeBar === false)) return TOOLBAR_PX;
    var r = mb.getBoundingClientRect();
    if (!r.height) return TOOLBAR_PX;
    return Math.max(TOOLBAR_PX, Math.round(r.bottom - gd.getBoundingClientRect().top));
  }

  // subplot titles, as viz._subplot_titles finds them: paper annotations anchored at their bottom, with no arrow
  function isSubplotTitle(a) {
    return a && (a.xref || 'paper') === 'paper' && (a.yref || 'paper') === 'paper' && a.yanchor === 'bottom' &&
      a.showarrow === false && a.text;
  }

  function frameTitles(gd) {   // the animation frames that set the title: [frame, its title object]
    var td = gd._transitionData, out = [];
    ((td && td._frames) || []).forEach(function (fr) {
      var t = fr && fr.layout && fr.layout.title;
      if (t && typeof t === 'object' && t.text) out.push([fr, t]);
      else if (typeof t === 'string' && t) { fr.layout.title = {text: t}; out.push([fr, fr.layout.title]); }
    });
    return out;
  }

  function fit(gd) {
    var L = gd._fullLayout, lay = gd.layout;
    if (!L || !lay || !L._size || !gd.isConnected || !L.width) return;
    if (busy(gd)) { gd._stFitLater = true; return; }
    var st = gd._stFit || (gd._stFit = {axes: {}, subs: {}, notes: {}, rounds: 0});
    var upd = {}, S = L._size, W = L.width, H = L.height, top = toolbarBottom(gd);
    var title = textOf(lay.title), FT = L.title || {};
    if (title !== st.set) {   // a title the page wrote (first, or set since), or an animation frame's that was fitted
      var fr = frameTitles(gd).filter(function (p) { return p[1].text === title && p[0]._stTitle !== undefined; })[0];
      st.orig = fr ? fr[0]._stTitle : title; st.set = title; st.rounds = 0;
    }
    if (W !== st.width) st.rounds = 0;
    if (++st.rounds > 4) return;   // a fit that does not settle stops (it never should)
    if (st.t0 === undefined) {   // what the page gave: the top margin, the lines it holds, where its title sits
      st.t0 = L.margin.t; st.h0 = H; st.n0 = nLines(title);
      st.place = FT.yref === 'container' && FT.yanchor === 'middle' && !FT.automargin ? 'viz' :   // viz.fit_figure's
        FT.yref === 'container' && FT.yanchor === 'top' && FT.automargin ? 'template' : 'other';  // viz.book_template's
      frameTitles(gd).forEach(function (p) { p[0]._stTitle = p[1].text; st.n0 = Math.max(st.n0, nLines(p[1].text)); });
    }
    var grow = top - TOOLBAR_PX, n = st.n0, font = fontOf(FT.font), size = font.size, h = 0, tTitle = st.t0, placed = false;

    if (st.orig) {   // the title: the room right of (or around) its anchor, less a gap from the figure's edge
      var x = (FT.xref === 'paper' ? S.l + FT.x * S.w : FT.x * W), anchor = FT.xanchor;
      if (anchor === 'auto' || !anchor) anchor = FT.x <= 1 / 3 ? 'left' : FT.x >= 2 / 3 ? 'right' : 'center';
      var pad = FT.pad || {}, room = anchor === 'left' ? W - x - (pad.l || 0) - SIDE_PX :
        anchor === 'right' ? x - (pad.r || 0) - SIDE_PX : 2 * Math.min(x, W - x) - 2 * SIDE_PX;
      var f = fitText(st.orig, room, font);
      n = f.lines;
      if (f.text !== title) upd['title.text'] = st.set = f.text;
      frameTitles(gd).forEach(function (p) {   // an animation's frames carry their own titles: fitted alike, in place
        if (p[0]._stTitle === undefined) p[0]._stTitle = p[1].text;
        var ff = fitText(p[0]._stTitle, room, font);
        p[1].text = ff.text; n = Math.max(n, ff.lines);
      });
      h = n * LINE_EM * size;
      // viz.book_template's title has plotly make its margin; but plotly draws a title of several lines anchored at its top
      // one line too high, and it puts a title's top level with the toolbar's foot: where a title is of several lines, or
      // reaches under the toolbar, or the toolbar wrapped, it goes where viz.fit_figure puts a title
      var mb = gd.querySelector('.modebar'), mbLeft = mb && mb.getBoundingClientRect().width ? mb.getBoundingClientRect().left - gd.getBoundingClientRect().left : W;
      var reach = anchor === 'left' ? x + (pad.l || 0) + f.widest : anchor === 'right' ? x : x + f.widest / 2;   // its right end, in px
      placed = st.place === 'viz' || (st.place === 'template' && (n > 1 || grow > 0 || reach > mbLeft - 4));
      if (placed) {   // its middle under the toolbar, in a margin that holds it
        if (FT.yanchor !== 'middle') upd['title.yanchor'] = 'middle';
        if (FT.automargin) upd['title.automargin'] = false;
        tTitle = st.place === 'viz' ? st.t0 + Math.max(0, n - st.n0) * LINE_EM * size + grow : Math.max(st.t0, top + h + 12);
      } else if (st.place === 'template' && !FT.automargin) {   // back where the page put it
        upd['title.y'] = 1; upd['title.yanchor'] = 'top'; upd['title.automargin'] = true;
      } else if (st.place === 'other' && FT.yref === 'container' && FT.yanchor === 'top' && !FT.automargin)
        tTitle = st.t0 + Math.max(0, n - st.n0) * LINE_EM * size;
    }

    // subplot titles: the room between a title and its neighbours in the same row
    var subs = (lay.annotations || []).map(function (a, i) { return [a, i]; }).filter(function (p) { return isSubplotTitle(p[0]); });
    var sub = 0, subSize = 16;
    var rows = {};   // a word longer than its room, or more than 3 lines, shrink the font of the row's titles, all alike
    subs.forEach(function (p) {
      var a = p[0], i = p[1], fa = (L.annotations || [])[i] || {}, sf = fontOf(fa.font, 16);
      if (!st.subs[i] || a.text !== st.subs[i].set) st.subs[i] = {orig: a.text, set: a.text, size: (st.subs[i] || {}).size || sf.size};
      var gaps = subs.filter(function (q) { return q[0] !== a && Math.abs((q[0].y || 1) - (a.y || 1)) < 1e-6; })
        .map(function (q) { return Math.abs((q[0].x || 0) - (a.x || 0)); }).filter(function (g) { return g > 1e-6; });
      var room = (gaps.length ? Math.min.apply(null, gaps) : 1) * S.w - SUB_PX, size0 = st.subs[i].size;
      var words = st.subs[i].orig.replace(/<[^<>]*>/g, ' ').split(/\s+/), longest = 0;
      words.forEach(function (w) { longest = Math.max(longest, measure(w, size0, sf.family, false)); });
      var want = longest > room ? Math.max(8, Math.floor(size0 * room / longest)) : size0, row = (a.y || 1).toFixed(3);
      while (want > 10 && fitText(st.subs[i].orig, room, {size: want, family: sf.family}).lines > 3) want -= 1;   // and to 3 lines
      rows[row] = Math.min(rows[row] || Infinity, want);
      p.push(room, sf.family, row);
    });
    subs.forEach(function (p) {
      var a = p[0], i = p[1], size = rows[p[4]], f = fitText(st.subs[i].orig, p[2], {size: size, family: p[3]});
      if (f.text !== a.text) upd['annotations[' + i + '].text'] = st.subs[i].set = f.text;
      if (size !== fontOf(((L.annotations || [])[i] || {}).font, 16).size) upd['annotations[' + i + '].font.size'] = size;
      if (a.y >= 0.999) { sub = Math.max(sub, f.lines); subSize = size; }
    });
    shrinkNotes(gd, L, st, upd);

    // axis titles: no longer than their axis
    Object.keys(L).filter(function (k) { return /^[xy]axis\d*$/.test(k); }).forEach(function (k) {
      var ax = L[k], text = textOf(lay[k] && lay[k].title);
      if (!ax || !ax._length || !text) return;
      if (!st.axes[k] || text !== st.axes[k].set) st.axes[k] = {orig: text, set: text};
      var f = fitText(st.axes[k].orig, ax._length, fontOf(ax.title && ax.title.font, 14));
      if (f.text !== text) upd[k + '.title.text'] = st.axes[k].set = f.text;
    });

    // the top margin: room for the toolbar, the title, the top row of subplot titles and a legend above the plot (as
    // viz.fit_figure reckons it, with this width's lines), and never less than the page gave
    var subRoom = sub ? Math.ceil(sub * LINE_EM * subSize) + 4 : 0, legRoom = legendAbove(gd, L);
    var need = (placed ? top + h + 12 : legRoom ? top : 8) + subRoom + legRoom, t = tTitle;
    if ((subRoom || legRoom) && need > t + 3) t = need;   // (not for the few px by which its estimate and viz's differ)
    t = Math.ceil(t);
    if (Math.abs(t - L.margin.t) >= 1) upd['margin.t'] = t;
    var height = st.h0 + Math.max(0, t - st.t0);   // the figure grows by what its top margin grew: the plot keeps its height
    if (Math.abs(height - H) >= 1) {
      upd.height = height;
      var box = gd.parentElement;   // plotly.py's HTML puts the figure in a box of its height: it grows alike
      if (box && box.style.height === st.h0 + 'px' || box && st.boxed) { st.boxed = true; box.style.height = height + 'px'; }
    }
    if (placed) {
      var y = 1 - (top + h / 2) / height;
      if (Math.abs(y - FT.y) * height > 0.5) upd['title.y'] = y;
    }
    st.width = W;
    var names = legendNames(gd, L, st);
    if (names) Plotly.update(gd, {name: names[1]}, upd, names[0]);
    else if (Object.keys(upd).length) Plotly.relayout(gd, upd);
  }

  /* Annotations (not subplot titles) that stick out of the figure, as a diagram's labels at a narrow width: their font
     shrinks until they fit (to 8 px at least); back to the page's size where that fits again. */
  function shrinkNotes(gd, L, st, upd) {
    var g = gd.getBoundingClientRect(), W = L.width;
    (L.annotations || []).forEach(function (fa, i) {
      var a = (gd.layout.annotations || [])[i], el = gd.querySelector('.annotation[data-index="' + i + '"] .annotation-text');
      if (!a || !el || isSubplotTitle(a) || !fa.font) return;
      var r = el.getBoundingClientRect(), size = fa.font.size, note = st.notes[i];
      if (!r.width) return;
      if (!note || Math.abs(note.set - size) > 0.01) note = st.notes[i] = {orig: size, set: size};
      var left = r.left - g.left, right = r.right - g.left, c = (left + right) / 2, w = r.width * note.orig / size;   // its width at the page's size
      var anchor = fa.xanchor;
      if (anchor === 'auto' || !anchor) anchor = fa.xref === 'paper' && !fa.showarrow ? (fa.x <= 1 / 3 ? 'left' : fa.x >= 2 / 3 ? 'right' : 'center') : 'center';
      var room = anchor === 'left' ? W - left - 2 : anchor === 'right' ? right - 2 : 2 * Math.min(c, W - c) - 4;
      if (left >= -1 && right <= W + 1 && size === note.orig) return;
      var want = w <= room ? note.orig : Math.max(8, Math.floor(note.orig * room / w));
      if (want !== size) upd['annotations[' + i + '].font.size'] = note.set = want;
    });
  }

  /* A legend beside the plot with entries so long that the plot would keep less than about half the figure (at a narrow
     width): its entries are wrapped (the traces' names, restyled) to fit 45% of the figure; put back where they fit.
     Returns [trace indices, names] to restyle, or null. */
  function legendNames(gd, L, st) {
    var lg = L.legend;
    if (!lg || !L.showlegend || lg.orientation === 'h' || !gd.data) return null;
    if (!st.names) st.names = gd.data.map(function (t) { return t.name; });
    var font = fontOf(lg.font, 12), room = 0.45 * L.width - 40, idx = [], names = [];
    gd.data.forEach(function (t, i) {
      var orig = st.names[i];
      if (typeof orig !== 'string' || !orig || t.showlegend === false) return;
      var want = fitText(orig, room, font).text;
      if (want !== t.name) { idx.push(i); names.push(want); }
    });
    return idx.length ? [idx, names] : null;
  }

  /* The room a legend above the plot takes (a horizontal legend anchored at its bottom on the plot's top, as
     viz.fit_figure reckons it: its rows and a gap), measured as drawn at this width; 0 for a legend elsewhere. */
  function legendAbove(gd, L) {
    var lg = L.legend, box = gd.querySelector('.legend');
    if (!lg || !box || !L.showlegend || lg.yref === 'container' || lg.y < 1 || lg.yanchor !== 'bottom') return 0;
    var r = box.getBoundingClientRect();
    return r.height ? Math.ceil(r.height) + 8 : 0;
  }

  var pending = new Set(), raf = 0;
  function schedule(gd) {
    pending.add(gd);
    if (!raf) raf = requestAnimationFrame(function () {
      raf = 0; var all = Array.from(pending); pending.clear();
      all.forEach(function (g) { try { fit(g); } catch (e) { if (window.console) console.warn('fit_figures:', e); } });
    });
  }

  var observer = window.ResizeObserver ? new ResizeObserver(function (entries) {
    entries.forEach(function (e) {
      var gd = e.target, st = gd._stFit;
      if (!st || Math.abs(gd.getBoundingClientRect().width - st.width) >= 1) schedule(gd);
    });
  }) : null;

  // a relayout that may change what fits: a new size, or a title, subplot title or axis title the page set (a fit's own
  // relayout comes back here too, and finds nothing left to change)
  var REFIT = /^(autosize|width|height|margin|title|annotations|[xy]axis\d*\.title)/;
  var watched = new WeakSet();
  function watch(gd) {
    if (watched.has(gd) || !gd._fullLayout || !gd.on) return;
    watched.add(gd);
    gd.on('plotly_relayout', function (ev) { if (ev && Object.keys(ev).some(function (k) { return REFIT.test(k); })) schedule(gd); });
    gd.on('plotly_update', function () { schedule(gd); });   // a fit that renamed legend entries
    gd.on('plotly_animated', function () { if (gd._stFitLater) { gd._stFitLater = false; schedule(gd); } });
    if (observer) observer.observe(gd);
    schedule(gd);
  }

  function scan() { document.querySelectorAll('.js-plotly-plot').forEach(watch); }
  window.stFit = {fit: fit, wrap: wrap, scan: scan};
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', scan);
  else scan();
  window.addEventListener('load', scan);
  var later = 0;   // figures drawn after load (a page's own scripts): looked for a few times, briefly
  var timer = setInterval(function () { scan(); if (++later >= 10) clearInterval(timer); }, 500);
})();
