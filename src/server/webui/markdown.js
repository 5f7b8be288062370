// A small markdown renderer for untrusted text (model replies, pasted messages). Every node is
// built with createElement and textContent, never from HTML: a reply holding `<script>` or
// `<img onerror=...>` shows those characters and runs nothing. Links keep only http(s) targets.
//
// Supported: fenced code blocks (``` with an optional language; an unclosed fence, as while a
// reply streams, runs to the end), headings, bullet and numbered lists, block quotes,
// paragraphs, and inline `code`, **bold**, *italic* and [text](https://...).

const kInline =
  /`([^`\n]+)`|\*\*([^*\n]+)\*\*|\*([^*\s][^*\n]*)\*|\[([^\]\n]+)\]\((https?:\/\/[^\s)]+)\)/g;

function appendInline(parent, text) {
  const doc = parent.ownerDocument;
  let last = 0;
  for (const m of text.matchAll(kInline)) {
    if (m.index > last) parent.append(doc.createTextNode(text.slice(last, m.index)));
    let node;
    if (m[1] !== undefined) {
      node = doc.createElement('code');
      node.textContent = m[1];
    } else if (m[2] !== undefined) {
      node = doc.createElement('strong');
      node.textContent = m[2];
    } else if (m[3] !== undefined) {
      node = doc.createElement('em');
      node.textContent = m[3];
    } else {
      node = doc.createElement('a');
      node.textContent = m[4];
      node.href = m[5];  // matched as http(s) only: no javascript: or data: targets
      node.rel = 'noopener noreferrer nofollow';
      node.target = '_blank';
    }
    parent.append(node);
    last = m.index + m[0].length;
  }
  if (last < text.length) parent.append(doc.createTextNode(text.slice(last)));
}

function codeBlock(doc, language, lines) {
  const pre = doc.createElement('pre');
  const code = doc.createElement('code');
  if (language) code.dataset.language = language;
  code.textContent = lines.join('\n');
  pre.append(code);
  const copy = doc.createElement('button');
  copy.type = 'button';
  copy.className = 'copy';
  copy.textContent = 'Copy';
  copy.addEventListener('click', () => {
    navigator.clipboard?.writeText(code.textContent).then(() => { copy.textContent = 'Copied'; },
                                                          () => { copy.textContent = 'Copy failed'; });
  });
  const wrap = doc.createElement('div');
  wrap.className = 'code';
  wrap.append(copy, pre);
  return wrap;
}

// Returns a DocumentFragment rendering `text`.
export function renderMarkdown(text, doc = document) {
  const out = doc.createDocumentFragment();
  const lines = String(text).replace(/\r\n?/g, '\n').split('\n');
  let paragraph = [];
  let list = null;  // the open <ul>/<ol>
  const flushParagraph = () => {
    if (paragraph.length === 0) return;
    const p = doc.createElement('p');
    paragraph.forEach((line, i) => {
      if (i > 0) p.append(doc.createElement('br'));
      appendInline(p, line);
    });
    out.append(p);
    paragraph = [];
  };
  const closeBlocks = () => {
    flushParagraph();
    list = null;
  };
  for (let i = 0; i < lines.length; ++i) {
    const line = lines[i];
    const fence = line.match(/^\s*```\s*([\w+#.-]*)\s*$/);
    if (fence) {
      closeBlocks();
      const body = [];
      for (++i; i < lines.length && !/^\s*```\s*$/.test(lines[i]); ++i) body.push(lines[i]);
      out.append(codeBlock(doc, fence[1], body));
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    const bullet = line.match(/^\s*[-*+]\s+(.*)$/);
    const numbered = line.match(/^\s*\d+[.)]\s+(.*)$/);
    const quote = line.match(/^>\s?(.*)$/);
    if (heading) {
      closeBlocks();
      const h = doc.createElement(`h${Math.min(heading[1].length + 2, 6)}`);
      appendInline(h, heading[2]);
      out.append(h);
    } else if (bullet || numbered) {
      flushParagraph();
      const tag = bullet ? 'UL' : 'OL';
      if (list === null || list.tagName !== tag) {
        list = doc.createElement(tag.toLowerCase());
        out.append(list);
      }
      const li = doc.createElement('li');
      appendInline(li, (bullet || numbered)[1]);
      list.append(li);
    } else if (quote) {
      closeBlocks();
      const q = doc.createElement('blockquote');
      appendInline(q, quote[1]);
      out.append(q);
    } else if (line.trim() === '') {
      closeBlocks();
    } else {
      list = null;
      paragraph.push(line);
    }
  }
  flushParagraph();
  return out;
}
