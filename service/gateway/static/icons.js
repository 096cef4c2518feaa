// The page's icons, drawn as inline SVG in the text's colour: emoji and symbol glyphs
// show as empty boxes where no font has them.

const SVG = 'http://www.w3.org/2000/svg';

/** Each icon: the SVG elements of a 24×24 drawing, stroked with the current colour. */
const DRAWINGS = {
  menu: [['path', { d: 'M4 6h16M4 12h16M4 18h16' }]],
  close: [['path', { d: 'M6 6l12 12M18 6L6 18' }]],
  refresh: [['path', { d: 'M20 11a8 8 0 1 0-2.3 5.7M20 4v7h-7' }]],
  down: [['path', { d: 'M12 5v14M6 13l6 6 6-6' }]],
  chevron: [['path', { d: 'M9 6l6 6-6 6' }]],
  check: [['path', { d: 'M5 12.5l4.5 4.5L19 7.5' }]],
  cross: [['path', { d: 'M7 7l10 10M17 7L7 17' }]],
  pending: [['circle', { cx: 12, cy: 12, r: 3.5, fill: 'currentColor', stroke: 'none' }]],
  wait: [['circle', { cx: 12, cy: 12, r: 8 }], ['path', { d: 'M12 7.5V12l3 2' }]],
  agent: [
    ['rect', { x: 4, y: 7, width: 16, height: 12, rx: 3 }],
    ['path', { d: 'M12 7V4M9 12.5h.01M15 12.5h.01M9.5 16h5' }],
  ],
  burst: [['path', { d: 'M12 2v5M12 17v5M2 12h5M17 12h5M5 5l3.5 3.5M15.5 15.5L19 19M19 5l-3.5 3.5M8.5 15.5L5 19' }]],
};

/** The icon `name` as an SVG element (decorative: hidden from screen readers). */
export function icon(name, className = '') {
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('viewBox', '0 0 24 24');
  svg.setAttribute('aria-hidden', 'true');
  svg.setAttribute('focusable', 'false');
  svg.setAttribute('class', `icon icon-${name} ${className}`.trim());
  for (const [tag, attrs] of DRAWINGS[name] || []) {
    const part = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs)) part.setAttribute(key, String(value));
    svg.append(part);
  }
  return svg;
}

/** Puts its icon into each element of `root` that names one (`data-icon="menu"`). */
export function placeIcons(root = document) {
  for (const el of root.querySelectorAll('[data-icon]')) el.prepend(icon(el.dataset.icon));
}
