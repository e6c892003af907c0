// Entry point of service/static/vendor/editor.js (bundled by frontend/build.mjs into one IIFE).
//
// window.KgradeEditor.attach(textarea) turns a <textarea> that has a <label for=...> into a
// CodeMirror 6 Python editor placed right after it. The textarea is hidden but stays the form
// field: its value is updated on every change, so a normal form POST sends the code.
//
// Keyboard: Tab is NOT bound (no indentWithTab), so Tab and Shift-Tab move focus out of the
// editor as in any other form field; indent with Mod-] / Mod-[ (the default keymap). Escape
// followed by Tab also leaves it (CodeMirror's tab-focus mode).

import { python } from "@codemirror/lang-python";
import {
  bracketMatching,
  HighlightStyle,
  indentOnInput,
  indentUnit,
  syntaxHighlighting,
} from "@codemirror/language";
import { EditorState } from "@codemirror/state";
import { highlightActiveLineGutter, lineNumbers } from "@codemirror/view";
import { tags } from "@lezer/highlight";
import { EditorView, minimalSetup } from "codemirror";

// CodeMirror's defaultHighlightStyle with the three colours that fall below 4.5:1 on white
// darkened (escapes/f-string parts #e40, type names #085, invalid #f00); every colour here is
// at least 6:1 on the white editor background.
const highlightStyle = HighlightStyle.define([
  { tag: tags.meta, color: "#404740" },
  { tag: tags.link, textDecoration: "underline" },
  { tag: tags.heading, textDecoration: "underline", fontWeight: "bold" },
  { tag: tags.emphasis, fontStyle: "italic" },
  { tag: tags.strong, fontWeight: "bold" },
  { tag: tags.strikethrough, textDecoration: "line-through" },
  { tag: tags.keyword, color: "#708" },
  { tag: [tags.atom, tags.bool, tags.url, tags.contentSeparator, tags.labelName], color: "#219" },
  { tag: [tags.literal, tags.inserted], color: "#164" },
  { tag: [tags.string, tags.deleted], color: "#a11" },
  { tag: [tags.regexp, tags.escape, tags.special(tags.string)], color: "#a63400" },
  { tag: tags.definition(tags.variableName), color: "#00f" },
  { tag: tags.local(tags.variableName), color: "#30a" },
  { tag: [tags.typeName, tags.namespace], color: "#076f44" },
  { tag: tags.className, color: "#167" },
  { tag: [tags.special(tags.variableName), tags.macroName], color: "#256" },
  { tag: tags.definition(tags.propertyName), color: "#00c" },
  { tag: tags.comment, color: "#940" },
  { tag: tags.invalid, color: "#b00" },
]);

// Light theme on top of CodeMirror's default light styling: a gutter at 6.8:1 (#555 on #f5f5f5)
// instead of 4.8:1, and a clearly visible focus ring instead of the 1px dotted default.
const kgradeTheme = EditorView.theme(
  {
    "&": {
      backgroundColor: "#fff",
      color: "#1a1a1a",
      border: "1px solid #767676",
      fontSize: "0.95rem",
    },
    "&.cm-focused": {
      outline: "2px solid #1a5fb4",
      outlineOffset: "1px",
    },
    ".cm-scroller": {
      fontFamily: "ui-monospace, SFMono-Regular, Menlo, Consolas, 'DejaVu Sans Mono', monospace",
      lineHeight: "1.5",
    },
    ".cm-content, .cm-gutter": { minHeight: "12em" },
    ".cm-content": { caretColor: "#000" },
    ".cm-gutters": {
      backgroundColor: "#f5f5f5",
      color: "#555",
      borderRight: "1px solid #ccc",
    },
    ".cm-activeLineGutter": { backgroundColor: "#e2f2ff", color: "#1a1a1a" },
  },
  { dark: false },
);

const views = new WeakMap();
let labelCounter = 0;

function labelIdFor(textarea) {
  const label = (textarea.labels && textarea.labels[0]) || null;
  if (!label) return null;
  if (!label.id) {
    let id;
    do {
      labelCounter += 1;
      id = `${textarea.id || "kgrade-editor"}-label${labelCounter > 1 ? `-${labelCounter}` : ""}`;
    } while (document.getElementById(id));
    label.id = id;
  }
  return label.id;
}

function accessibleAttributes(textarea) {
  const attrs = {};
  const labelId = labelIdFor(textarea);
  if (labelId) {
    attrs["aria-labelledby"] = labelId;
  } else if (textarea.getAttribute("aria-labelledby")) {
    attrs["aria-labelledby"] = textarea.getAttribute("aria-labelledby");
  } else if (textarea.getAttribute("aria-label")) {
    attrs["aria-label"] = textarea.getAttribute("aria-label");
  }
  const describedBy = textarea.getAttribute("aria-describedby");
  if (describedBy) attrs["aria-describedby"] = describedBy;
  if (textarea.getAttribute("aria-invalid")) {
    attrs["aria-invalid"] = textarea.getAttribute("aria-invalid");
  }
  if (textarea.required) attrs["aria-required"] = "true";
  if (textarea.readOnly) attrs["aria-readonly"] = "true";
  return attrs;
}

function attach(textarea) {
  if (!textarea || textarea.tagName !== "TEXTAREA") {
    throw new TypeError("KgradeEditor.attach expects a <textarea> element");
  }
  const existing = views.get(textarea);
  if (existing) return existing;

  const readOnly = textarea.readOnly || textarea.disabled;
  const view = new EditorView({
    state: EditorState.create({
      doc: textarea.value,
      extensions: [
        // minimalSetup: special-character highlighting, undo history, drawn selection, and
        // the default keymap + history keymap (neither binds Tab).
        minimalSetup,
        lineNumbers(),
        highlightActiveLineGutter(),
        indentOnInput(),
        indentUnit.of("    "), // PEP 8
        bracketMatching(),
        python(),
        syntaxHighlighting(highlightStyle),
        kgradeTheme,
        // Long lines wrap: in a phone-sized LMS frame nothing scrolls sideways (a sideways
        // scroller in a contenteditable is out of keyboard reach, axe's
        // scrollable-region-focusable).
        EditorView.lineWrapping,
        EditorState.readOnly.of(readOnly),
        EditorView.editable.of(!textarea.disabled),
        EditorView.contentAttributes.of(accessibleAttributes(textarea)),
        EditorView.updateListener.of((update) => {
          if (!update.docChanged) return;
          textarea.value = update.state.doc.toString();
          textarea.dispatchEvent(new Event("input", { bubbles: true }));
        }),
      ],
    }),
  });
  textarea.after(view.dom);
  textarea.hidden = true;
  // The browser would refuse to submit a form whose hidden required field is empty without
  // being able to show where; the editor's aria-required carries the requirement instead.
  if (textarea.required) textarea.required = false;
  views.set(textarea, view);
  return view;
}

function setValue(view, text) {
  view.dispatch({
    changes: { from: 0, to: view.state.doc.length, insert: String(text ?? "") },
  });
}

window.KgradeEditor = { attach, setValue };
