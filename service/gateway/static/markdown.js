// Answers as Markdown: parsed by marked, sanitised by DOMPurify (nothing a model writes
// can run script: no <script>, no event handler attributes, no javascript: links), code
// highlighted by highlight.js. The libraries are vendored (vendor/, `make vendor`).
//
// A streamed answer is parsed again as its deltas arrive, at most once per animation
// frame, and only its blocks that changed are rendered again: the finished blocks
// (paragraphs, lists, tables, code) keep their nodes, the block still being written is
// replaced. Code is highlighted once its block is finished.

import DOMPurify from './vendor/dompurify/purify.es.mjs';
import hljs from './vendor/highlight/highlight.min.js';
import { Marked } from './vendor/marked/marked.esm.js';

const marked = new Marked({ gfm: true, breaks: true });

/** HTML only (no SVG or MathML), no forms or frames, no inline styles. */
const PURIFY = {
  USE_PROFILES: { html: true },
  FORBID_TAGS: ['style', 'form', 'input', 'button', 'textarea', 'select', 'iframe'],
  FORBID_ATTR: ['style'],
};

// Links open in a new tab, without handing it this page.
DOMPurify.addHook('afterSanitizeAttributes', (node) => {
  if (node.tagName === 'A' && node.hasAttribute('href')) {
    node.setAttribute('target', '_blank');
    node.setAttribute('rel', 'noopener noreferrer');
  }
});

/** The sanitised HTML of `tokens` (marked's), with the answer's link definitions. */
function html(tokens, links) {
  return DOMPurify.sanitize(marked.parser(Object.assign([...tokens], { links })), PURIFY);
}

/** Highlights the code blocks under `root`: by their language when it is named and
 *  known, else by the language highlight.js finds likeliest. */
function highlight(root) {
  for (const code of root.querySelectorAll('pre code')) {
    const language = /\blanguage-([\w+#-]+)/.exec(code.className)?.[1];
    const text = code.textContent;
    const result = language && hljs.getLanguage(language)
      ? hljs.highlight(text, { language, ignoreIllegals: true })
      : hljs.highlightAuto(text);
    code.innerHTML = DOMPurify.sanitize(result.value, PURIFY); // spans around escaped text
    code.classList.add('hljs');
  }
}

/** An answer rendered as Markdown into `el` as its text arrives. */
export class MarkdownBlock {
  constructor(el) {
    this.el = el;
    this.text = '';
    this.parts = []; // [{raw, whole, nodes}]: the rendered blocks, in order
    this.frame = 0;
  }

  /** More text: rendered at the next animation frame (one render for all of a frame's). */
  append(delta) {
    this.text += delta;
    if (!this.frame) {
      this.frame = requestAnimationFrame(() => {
        this.frame = 0;
        this.render(false);
      });
    }
  }

  /** The answer is whole (`text`: all of it at once, from history): render it now. */
  finish(text) {
    if (text !== undefined) this.text = text;
    if (this.frame) cancelAnimationFrame(this.frame);
    this.frame = 0;
    this.render(true);
  }

  render(final) {
    const tokens = marked.lexer(this.text);
    let kept = 0;
    while (kept < this.parts.length && kept < tokens.length - 1
      && this.parts[kept].whole && this.parts[kept].raw === tokens[kept].raw) kept++;
    for (const part of this.parts.splice(kept)) part.nodes.forEach((node) => node.remove());
    tokens.slice(kept).forEach((token, index) => {
      const whole = final || kept + index < tokens.length - 1; // the last may grow still
      const box = document.createElement('div');
      box.innerHTML = html([token], tokens.links);
      if (whole) highlight(box);
      const nodes = [...box.childNodes];
      this.el.append(...nodes);
      this.parts.push({ raw: token.raw, whole, nodes });
    });
  }
}
