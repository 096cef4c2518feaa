// Answers to frontend tools: a form built from the tool's answer schema (JSON Schema),
// and the tool's own HTML view in a sandboxed iframe that answers by postMessage.

import { h } from './dom.js';

/** One input for a schema property; `read()` gives its typed value, or undefined when empty. */
function field(name, spec, required) {
  const label = spec.title || name;
  const hint = spec.description ? h('span', { class: 'note' }, spec.description) : null;
  const wrap = (input) => h('label', { class: 'field', 'data-field': name },
    h('span', { class: 'field-label' }, label, required ? h('span', { class: 'required' }, ' *') : null),
    input, hint);
  const initial = spec.default;
  if (Array.isArray(spec.enum)) {
    const select = h('select', { name, required },
      required && initial === undefined ? h('option', { value: '' }, 'choose…') : null,
      required ? null : h('option', { value: '' }, '—'),
      ...spec.enum.map((value, i) => h('option', { value: String(i), selected: value === initial },
        String(value))));
    return { el: wrap(select), read: () => (select.value === '' ? undefined : spec.enum[Number(select.value)]) };
  }
  if (spec.type === 'boolean') {
    const box = h('input', { type: 'checkbox', name, checked: initial === true });
    return { el: wrap(box), read: () => box.checked };
  }
  if (spec.type === 'integer' || spec.type === 'number') {
    const integer = spec.type === 'integer';
    const input = h('input', {
      type: 'number', name, required, step: integer ? '1' : 'any',
      min: spec.minimum, max: spec.maximum, value: initial,
    });
    return {
      el: wrap(input),
      read: () => {
        if (input.value === '') return undefined;
        const value = Number(input.value);
        if (integer && !Number.isInteger(value)) throw new Error(`${label}: a whole number`);
        return value;
      },
    };
  }
  if (spec.type === 'array' && Array.isArray(spec.items?.enum)) {
    const chosen = new Set(Array.isArray(initial) ? initial : []);
    const boxes = spec.items.enum.map((value) => [value, h('input', {
      type: 'checkbox', name, checked: chosen.has(value),
    })]);
    const group = h('span', { class: 'choices' }, ...boxes.map(([value, box]) => h('label', {
      class: 'choice' }, box, String(value))));
    return { el: wrap(group), read: () => boxes.filter(([, box]) => box.checked).map(([v]) => v) };
  }
  if (spec.type === 'string' || (spec.type === 'array' && spec.items?.type === 'string')) {
    const list = spec.type === 'array';
    const long = list || (spec.maxLength || 0) > 200;
    const text = list && Array.isArray(initial) ? initial.join('\n') : (initial ?? '');
    const input = long
      ? h('textarea', { name, required, placeholder: list ? 'one per line' : '' }, text)
      : h('input', { type: 'text', name, required, value: text });
    return {
      el: wrap(input),
      read: () => {
        if (!list) return input.value === '' ? undefined : input.value;
        const items = input.value.split('\n').map((s) => s.trim()).filter(Boolean);
        return items.length ? items : undefined;
      },
    };
  }
  // Objects and anything else: JSON.
  const input = h('textarea', { name, required, class: 'json', placeholder: 'JSON' },
    initial === undefined ? '' : JSON.stringify(initial, null, 2));
  return {
    el: wrap(input),
    read: () => {
      if (!input.value.trim()) return undefined;
      try {
        return JSON.parse(input.value);
      } catch {
        throw new Error(`${label}: not valid JSON`);
      }
    },
  };
}

/**
 * A form for an answer described by `schema`: an object's properties become fields
 * (types, `required`, `enum`, `default`, `description`), any other schema one field.
 * `onAnswer(payload)` gets the typed answer; integers stay integers.
 */
export function schemaForm(schema, onAnswer, submitLabel = 'Submit') {
  const isObject = schema.type === 'object';
  const required = new Set(isObject ? schema.required || [] : ['answer']);
  // The schema comes through a protobuf Struct, which keeps no key order: the required
  // fields come first, as `required` lists them, then the others by name.
  const rank = (name) => (required.has(name) ? [...required].indexOf(name) : required.size);
  const specs = isObject
    ? Object.entries(schema.properties || {})
      .sort(([a], [b]) => rank(a) - rank(b) || a.localeCompare(b))
    : [['answer', schema]];
  const fields = specs.map(([name, spec]) => [name, field(name, spec || {}, required.has(name))]);
  const error = h('div', { class: 'note bad' });
  const form = h('form', { class: 'tool-form schema-form', novalidate: true },
    ...fields.map(([, f]) => f.el), error,
    h('div', { class: 'buttons' }, h('button', { type: 'submit', class: 'primary' }, submitLabel)));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    error.textContent = '';
    try {
      const payload = {};
      for (const [name, f] of fields) {
        const value = f.read();
        if (value === undefined && required.has(name)) throw new Error(`${name}: required`);
        if (value !== undefined) payload[name] = value;
      }
      onAnswer(isObject ? payload : payload.answer);
    } catch (failure) {
      error.textContent = failure.message;
    }
  });
  return form;
}

/**
 * The tool's HTML view in an iframe sandboxed to scripts only (no same origin, no forms,
 * no navigation, no pop-ups). The page posts it {type: "agw.tool", toolId, toolName,
 * arguments, params} once loaded; it answers {type: "agw.submit", toolId, payload} and may
 * ask for a height with {type: "agw.resize", height}. Messages from other windows are ignored.
 * (The page then tells it {type: "agw.answered", accepted, detail}: see RunView.answer.)
 */
export function viewFrame({ toolId, toolName, html, args, params }, onAnswer) {
  const frame = h('iframe', {
    class: 'tool-view', sandbox: 'allow-scripts', srcdoc: html, title: `${toolName} view`,
  });
  if (Number(params?.width) > 0) frame.style.maxWidth = `${Number(params.width)}px`;
  const listen = (event) => {
    if (!frame.isConnected) {
      window.removeEventListener('message', listen);
      return;
    }
    if (event.source !== frame.contentWindow) return;
    const data = event.data || {};
    if (data.type === 'agw.submit' && data.toolId === toolId) {
      onAnswer(data.payload ?? null);
    } else if (data.type === 'agw.resize' && Number.isFinite(data.height)) {
      frame.style.height = `${Math.min(Math.max(data.height, 40), 800)}px`;
    }
  };
  window.addEventListener('message', listen);
  frame.addEventListener('load', () => {
    frame.contentWindow.postMessage(
      { type: 'agw.tool', toolId, toolName, arguments: args, params: params || {} }, '*');
  });
  return frame;
}
