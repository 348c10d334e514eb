// Voice studio: talks to the server's /v1 API with relative URLs, so that it works at "/"
// and under Home Assistant ingress's path prefix alike. No build step, no libraries.
"use strict";

const KEY_STORAGE = "qwen3tts-api-key";
const SAMPLE_RATE = 24000;
const KINDS = {voice_design: ["Preset", "preset"], base: ["Clone", "clone"], custom_voice: ["Speaker", "speaker"]};
// What a voice without a clip (a speaker, a preset while anchors are off) says when played.
const GREETINGS = {
    en: "Hello! This is how I sound.", de: "Hallo! So klinge ich.", fr: "Bonjour ! Voici ma voix.",
    es: "¡Hola! Así suena mi voz.", it: "Ciao! Questa è la mia voce.", pt: "Olá! Esta é a minha voz.",
    ru: "Привет! Вот так звучит мой голос.", zh: "你好！这就是我的声音。", ja: "こんにちは！これが私の声です。",
    ko: "안녕하세요! 제 목소리는 이렇습니다.",
};

const $ = (id) => document.getElementById(id);
const state = {voices: [], defaultVoice: null, defaultPinned: false, defaultServed: true, voicesFolder: null, skipped: [],
    models: null, playing: null, playButtons: new Map(), tryAbort: null, speakLine: null, recorded: null,
    voiceLines: new Map(), skippedLines: new Map(), renames: new Map()};
// What a voice of the user's takes the place of (the listing's "shadows"), as the page names it.
const BENEATH = {shipped: "shipped preset", user: "preset", builtin: "built-in speaker"};
const OVERRIDE_MARKS = {shipped: "overrides the shipped preset", user: "overrides your preset",
    builtin: "overrides the built-in speaker"};
// GET /v1/models lists these names exactly when the server has the model loaded.
const DESIGN_MODEL = "qwen3-tts-voice-design";
const CLONE_MODEL = "qwen3-tts-clone";
// Read by the browser tests: what the streaming player received and scheduled.
window.studioStats = {streamBytes: 0, streamChunks: 0, streamDone: false, samplesEnded: 0};

// --- API ----------------------------------------------------------------------------------

class ApiError extends Error {
    constructor(status, body) {
        const error = (body && body.error) || {};
        super(error.message || `HTTP ${status}`);
        this.status = status;
        this.code = error.code;
    }
}

function headers(extra) {
    const result = Object.assign({}, extra || {});
    const key = localStorage.getItem(KEY_STORAGE);
    if (key) result["Authorization"] = "Bearer " + key;
    return result;
}

async function api(path, options) {
    options = options || {};
    const response = await fetch(path, Object.assign({}, options, {headers: headers(options.headers)}));
    if (!response.ok) {
        let body = null;
        try { body = await response.json(); } catch (e) { /* not JSON */ }
        const error = new ApiError(response.status, body);
        if (response.status === 401) askForKey(localStorage.getItem(KEY_STORAGE) !== null);
        throw error;
    }
    return response;
}

async function apiJson(path, method, body) {
    const response = await api(path, {
        method: method,
        headers: {"Content-Type": "application/json"},
        body: JSON.stringify(body),
    });
    return response.json();
}

const voiceUrl = (name) => "v1/audio/voices/" + encodeURIComponent(name);

// --- messages and API key -------------------------------------------------------------------

function say(text, kind) {
    const box = $("message");
    box.textContent = text;
    box.className = "message " + (kind || "");
    box.hidden = !text;
}

// The server's words for some codes name this page by its address: the page says them its own way.
const OWN_WORDS = {
    "no-voices": "This server has no voice yet: upload a clip under Clone a voice below (or copy one into the " +
        "voices folder), then try again.",
};

function errorText(error) {
    return error && OWN_WORDS[error.code] ? OWN_WORDS[error.code] : error && error.message ? error.message : String(error);
}

function fail(error) {
    if (error && (error.name === "AbortError" || error.status === 401)) return;  // 401: the key form says it
    say(errorText(error), "error");
}

// A form's own status line, beside the button that was pressed: the message at the top of
// the page is far out of view on a phone (1490 px above "Create voice"), so a refusal or a
// success is said here too. An error or a result stays until the form changes or the user
// tries again; so does a plain result (kind "result": "stopped", shown as a note); a neutral
// note while something goes on ("uploading…") has no kind.
function setStatus(node, text, kind) {
    // The error it replaces goes from the top of the page too, if that still says it.
    const message = $("message");
    if (node.dataset.error && !message.hidden && message.textContent === node.dataset.error) say("");
    if (kind === "error") node.dataset.error = text;
    else delete node.dataset.error;
    node.textContent = text;
    node.classList.add("status");
    node.classList.toggle("error", kind === "error");
    node.classList.toggle("ok", kind === "ok");
    node.classList.toggle("result", kind === "result");
    if (kind === "error") node.setAttribute("role", "alert");
    else node.removeAttribute("role");
    // A row's line keeps its error across reloads of the list (rowLine): the user may put it away.
    if (kind === "error" && "keep" in node.dataset) {
        const dismiss = el("button", {type: "button", className: "dismiss", textContent: "×", title: "Dismiss"});
        dismiss.setAttribute("aria-label", "Dismiss");
        dismiss.addEventListener("click", () => setStatus(node, ""));
        node.append(" ", dismiss);
    }
    // An error that ended below the window's edge (a wrapped line under the button) is brought in.
    if (kind === "error" && node.isConnected) node.scrollIntoView({block: "nearest"});
}

// A row's own status line (a voice's Play, Rename and Delete; a skipped file's Delete) is one
// node per row, kept in "lines" (key: the row's name) and moved into the row each time the
// list is drawn again (Reload, or the reload after any action): an answer that comes after a
// redraw lands in the row on screen, and what the line says stays. The rule for an error
// there: it stays until the user presses a button of that row again (the press clears it,
// and the new action says its own note or result), dismisses it with its ×, or the row leaves
// the list (the voice or file is gone; a later row of the same name starts blank). Notes and
// results stay too, until the next action replaces them. (An open rename form is kept across
// redraws likewise, its answer in it: startRename.)
function rowLine(lines, drawn, key, className) {
    const node = lines.get(key) || el("span", {className: className});
    node.dataset.keep = "";
    drawn.set(key, node);
    return node;
}

// Pressing a button of a row clears the error of its line, before the button acts.
function clearOnPress(row, line) {
    row.addEventListener("click", (event) => {
        if (event.target.closest("button") && line.classList.contains("error")) setStatus(line, "");
    }, true);
}

// The error said beside the button pressed (and at the top of the page, as before).
function failAt(node, error) {
    if (error && (error.name === "AbortError" || error.status === 401)) { setStatus(node, ""); return; }
    setStatus(node, errorText(error), "error");
    fail(error);
}

// Changing a form clears its status line's last error or result (not a note in progress).
function clearOnChange(node, inputs) {
    const clear = () => {
        if (["error", "ok", "result"].some(kind => node.classList.contains(kind))) setStatus(node, "");
    };
    for (const input of inputs) {
        input.addEventListener("input", clear);
        input.addEventListener("change", clear);
    }
}

function askForKey(rejected) {
    $("key-form").hidden = false;
    $("key-forget").hidden = true;
    say(rejected ? "The server refused that API key: enter the right one at the top right."
        : "This server asks for an API key: enter it at the top right.", "error");
    $("key-input").focus();
}

$("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("key-input").value.trim();
    if (!key) return;
    localStorage.setItem(KEY_STORAGE, key);
    $("key-input").value = "";
    $("key-form").hidden = true;
    $("key-forget").hidden = false;
    say("");
    loadVoices();
});

$("key-forget").addEventListener("click", () => {
    localStorage.removeItem(KEY_STORAGE);
    $("key-forget").hidden = true;
    loadVoices();
});

// --- voice list -----------------------------------------------------------------------------

function el(tag, props, children) {
    const node = document.createElement(tag);
    Object.assign(node, props || {});
    for (const child of children || []) node.append(child);
    return node;
}

function button(text, onClick, className) {
    const node = el("button", {type: "button", textContent: text, className: "small " + (className || "")});
    node.addEventListener("click", onClick);
    return node;
}

function servedCell(voice) {
    if (voice.unservable) {  // its model cannot run on this GPU: the server refuses it, says why
        return el("span", {className: "served-none", textContent: "cannot be spoken",
            title: voice.unservable}, [el("span", {className: "sub", textContent: "its model does not fit this GPU"})]);
    }
    if (voice.served === "anchor") {
        return el("span", {className: "served-anchor", textContent: "anchor",
            title: "Spoken by the Base model as a clone of its anchor clip: the same voice every time"});
    }
    if (voice.served === "designed-live") {
        const why = {pending: "anchor on its way", waiting: "anchor when used", failed: "anchor failed",
            off: "no anchor", ready: "Base model off"}[voice.anchor] || "";
        return el("span", {className: "served-live", textContent: "designed live",
            title: "Designed afresh from its description for each sentence"},
            why ? [el("span", {className: "sub", textContent: why})] : []);
    }
    return el("span", {textContent: voice.served});
}

// Voice names compare as the server compares them: in any case, composed or not, spaces aside.
const nameKey = (name) => (name || "").normalize("NFC").trim().toLowerCase();
const sameName = (a, b) => a != null && b != null && nameKey(a) === nameKey(b);

function languagesText(codes) {
    return codes.length >= 10 ? "all ten" : codes.join(" ");
}

async function loadVoices() {
    let listing;
    try {
        listing = await (await api("v1/audio/voices")).json();
    } catch (error) {
        if (error.status !== 401) fail(error);
        return;
    }
    if (localStorage.getItem(KEY_STORAGE)) $("key-forget").hidden = false;
    state.voices = listing.voices.slice().sort((a, b) => a.name.localeCompare(b.name, undefined, {sensitivity: "base"}));
    state.defaultVoice = listing.default;
    state.defaultPinned = listing.default_pinned === true;
    state.voicesFolder = listing.voices_folder || null;
    state.skipped = listing.skipped || [];
    state.defaultServed = listing.default_served !== false;
    try {
        const models = await (await api("v1/models")).json();
        state.models = models.data.map((model) => model.id);
    } catch (error) {
        if (error.status !== 401) fail(error);  // what it can do stays unknown: all is offered
    }
    renderModels();
    renderVoices();
}

// A section whose model is off says so instead of offering what the server refuses.
function renderModels() {
    const known = state.models !== null;
    const canDesign = !known || state.models.includes(DESIGN_MODEL);
    const canClone = !known || state.models.includes(CLONE_MODEL);
    $("design-body").hidden = !canDesign;
    $("design-off").hidden = canDesign;
    $("design-off").textContent = canDesign ? "" : "Not available: this server has no VoiceDesign model loaded, " +
        "so it cannot design voices (or speak presets). Enable it (--design-model; the add-on's design_model " +
        "option) and restart the server to design voices here.";
    $("clone-body").hidden = !canClone;
    $("clone-off").hidden = canClone;
    $("clone-off").textContent = canClone ? "" : "Not available: this server has no clone (Base) model loaded, " +
        "so it cannot clone voices. Enable it (--clone-model) and restart the server to clone voices here.";
}

// No voice yet (the clone model alone, no clip): how to add the first one, as the server's
// start-up warning says it.
function renderEmptyHint() {
    const hint = $("voices-empty");
    const empty = state.voices.length === 0;
    hint.hidden = !empty;
    $("voices").closest(".table-wrap").hidden = empty;
    if (!empty) return;
    const folder = state.voicesFolder
        ? [document.createTextNode("the voices folder "), el("code", {className: "folder", textContent: state.voicesFolder})]
        : [document.createTextNode("the server's voices folder")];
    const upload = $("clone-body").hidden ? [] : [
        document.createTextNode("Upload one under "), el("a", {href: "#clone-section", textContent: "Clone a voice"}),
        document.createTextNode(" on this page, or copy "),
    ];
    hint.replaceChildren(
        el("strong", {textContent: "No voice yet. "}),
        ...(upload.length ? upload : [document.createTextNode("Copy ")]),
        el("code", {textContent: "<id>.wav"}), document.createTextNode(" and its transcript "),
        el("code", {textContent: "<id>.txt"}), document.createTextNode(" into "), ...folder,
        document.createTextNode(" (then Reload this list): it is spoken at once, without a restart, " +
            "and becomes the default voice."),
    );
}

// Clips of the voices folder that are no voice (too short, silent, unreadable): why, and Delete.
function renderSkipped() {
    const box = $("voices-skipped");
    box.hidden = state.skipped.length === 0;
    const list = el("ul", {className: "skipped-list"});
    const drawn = new Map();
    for (const clip of state.skipped) {
        const line = rowLine(state.skippedLines, drawn, clip.file, "status");
        const item = el("li", {}, [
            el("code", {className: "skipped-file", textContent: clip.file}), document.createTextNode(": " + clip.reason + " "),
            button("Delete", () => deleteSkipped(clip, line), "danger"), line,
        ]);
        clearOnPress(item, line);
        item.dataset.skipped = clip.name;
        item.dataset.file = clip.file;
        list.append(item);
    }
    state.skippedLines = drawn;
    box.replaceChildren(
        el("strong", {textContent: "Skipped files. "}),
        document.createTextNode("These clips of the voices folder are no voice. Delete one here, or upload a good " +
            "clip under its name under Clone a voice to replace it (not under a preset's or a built-in speaker's name: " +
            "replace that file in the folder)."),
        list,
    );
}

// "a, b and c"
const listText = (items) => items.length < 2 ? items.join("") : items.slice(0, -1).join(", ") + " and " + items.at(-1);
// A file name as a message says it: in quotes where spaces around it or control characters would not show.
const fileText = (file) => /^\s|\s$|[\u0000-\u001f\u007f]/.test(file) ? JSON.stringify(file) : file;

// What a skipped file's Delete removes, as the server does it (library.VoiceLibrary._delete_skipped):
// every skipped file of its voice name. Where a clone voice of that name is spoken (kim.mp3
// beside kim.wav), those alone, never the voice's clip or transcript; else their transcripts too.
function skippedQuestion(clip, files, shown) {
    const voice = state.voices.find((v) => v.source === "clone" && sameName(v.name, clip.name));
    const together = files.length > 1 ? " (skipped files of one voice name go together)" : "";
    const why = `${files.length > 1 ? fileText(clip.file) : "It"} is no voice: ${clip.reason}.`;
    if (voice) {
        return `Delete ${shown} from the voices folder${together}? ${why} The voice ${voice.name} keeps its clip and ` +
            "transcript (if any).";
    }
    if (files.every((c) => c.file.toLowerCase().endsWith(".txt"))) {  // a transcript with no clip beside it
        return `Delete ${shown} from the voices folder${together}? ${why}`;
    }
    return `Delete ${shown} and ${files.length > 1 ? "their transcripts" : "its transcript"} (if any) from the voices ` +
        `folder${together}? ${why}`;
}

async function deleteSkipped(clip, status) {
    const files = [clip, ...state.skipped.filter((c) => c !== clip && nameKey(c.name) === nameKey(clip.name))];
    const shown = listText(files.map((c) => fileText(c.file)));
    if (!confirm(skippedQuestion(clip, files, shown))) return;
    setStatus(status, "deleting…");
    try {
        // A blank name (" .wav"): the server strips the name asked for too, so " " asks for it.
        const answer = await (await api(voiceUrl(clip.name || " ") + "?skipped=true", {method: "DELETE"})).json();
        const removed = answer.files || files.map((c) => c.file);  // every file the server removed
        say(`Deleted ${removed.length > 1 ? "the files" : "the file"} ${listText(removed.map(fileText))}.`, "ok");
        await loadVoices();
    } catch (error) { failAt(status, error); }
}

function renderVoices() {
    const body = $("voices").querySelector("tbody");
    const focused = body.contains(document.activeElement) ? document.activeElement : null;
    body.replaceChildren();
    const drawn = new Map();
    const renames = new Map();
    const playButtons = new Map();
    for (const voice of state.voices) {
        const key = nameKey(voice.name);
        const [kindText, kindClass] = KINDS[voice.kind] || [voice.kind, ""];
        const isDefault = sameName(voice.name, state.defaultVoice);
        const nameCell = el("td", {className: "name"}, [el("span", {className: "voice-name", textContent: voice.name})]);
        if (isDefault) nameCell.append(el("span", {className: "default-mark", textContent: "default"}));
        const beneath = BENEATH[voice.shadows];
        if (beneath) {
            nameCell.append(el("span", {className: "override-mark", textContent: OVERRIDE_MARKS[voice.shadows],
                title: `Your ${voice.source === "user" ? "preset" : "clone"} ${voice.name} is spoken in place of the ` +
                    `${beneath} ${voice.name}; deleting or renaming it brings that one back`}));
        }
        if (voice.aliases.length) nameCell.append(el("span", {className: "aliases", textContent: voice.aliases.join(", ")}));
        // The server's rule (library.VoiceLibrary.editable): your voices (presets and clones)
        // may be renamed or deleted; a default voice chosen with --voice (default_pinned) only
        // when it takes the place of another voice of its name (shadows), which then serves
        // the name; a default the server chose may go (it picks the next).
        const editable = (voice.source === "user" || voice.source === "clone")
            && (!isDefault || !state.defaultPinned || Boolean(beneath));
        // This row's own status line: what its Play, Rename or Delete was refused with.
        const rowStatus = rowLine(state.voiceLines, drawn, key, "status row-status");
        const play = button("▶ Play", () => playSample(voice, rowStatus));
        playButtons.set(key, play);
        const actions = el("td", {className: "actions"}, [
            play,
            button("Try", () => { chooseTryVoice(voice.name); $("try-text").focus(); }),
        ]);
        if (editable) {
            actions.append(button("Rename", () => startRename(voice, nameCell)));
            const rename = state.renames.get(key);  // an open form stays open, with what was typed
            if (rename) {
                nameCell.replaceChildren(...rename);
                renames.set(key, rename);
            }
            const remove = button("Delete", () => deleteVoice(voice, rowStatus), "danger");
            if (beneath) remove.title = `Delete your ${voice.source === "user" ? "preset" : "voice"}: the ${beneath} ${voice.name} comes back`;
            actions.append(remove);
        }
        actions.append(rowStatus);
        const row = el("tr", {}, [
            nameCell,
            el("td", {}, [el("span", {className: "badge " + kindClass, textContent: kindText})]),
            el("td", {textContent: languagesText(voice.languages)}),
            el("td", {className: "served"}, [servedCell(voice)]),
            el("td", {className: "summary", textContent: voice.summary}),
            actions,
        ]);
        row.dataset.voice = voice.name;
        clearOnPress(row, rowStatus);
        body.append(row);
    }
    state.voiceLines = drawn;
    state.renames = renames;
    state.playButtons = playButtons;
    showPlaying();
    if (focused && focused.isConnected) focused.focus({preventScroll: true});  // a rename form's field
    $("voice-count").textContent = state.voices.length + (state.voices.length === 1 ? " voice" : " voices");
    renderEmptyHint();
    renderSkipped();
    if (!state.defaultServed && state.defaultVoice) {
        say(`The server's default voice ${state.defaultVoice} (--voice) is gone: requests that name no voice ` +
            `(Home Assistant's, without a voice option) are refused. Put its clip back into the voices folder, ` +
            `upload one named ${state.defaultVoice} under Clone a voice, or choose another default voice and restart.`, "error");
    }
    const noVoice = state.voices.length === 0;
    $("try-speak").disabled = noVoice;
    $("try-speak").title = noVoice ? "No voice yet: add one first" : "";
    const noVoiceText = "No voice to speak with yet: add one first.";
    if (noVoice) $("try-status").textContent = noVoiceText;
    else if ($("try-status").textContent === noVoiceText) $("try-status").textContent = "";
    const select = $("try-voice");
    const chosen = select.value || state.defaultVoice;
    select.replaceChildren(...state.voices.map((v) => el("option", {value: v.name, textContent: v.name})));
    chooseTryVoice(state.voices.some((v) => v.name === chosen) ? chosen : state.defaultVoice);
}

// The select may be too narrow for a long name: its title holds the whole of it.
function chooseTryVoice(name) {
    $("try-voice").value = name;
    $("try-voice").title = $("try-voice").value;
}
$("try-voice").addEventListener("change", () => chooseTryVoice($("try-voice").value));

// An open rename form is kept in state.renames (key: the row's name) and moved into the row
// at each redraw, with what was typed and the focus: a reload does not close it, and its
// answer is said in it, on screen. Cancel or a rename done puts it away, as does the row's
// leaving the list.
function startRename(voice, cell) {
    const key = nameKey(voice.name);
    const input = el("input", {type: "text", value: voice.name, maxLength: 48});
    const status = el("span", {className: "status rename-status"});
    const close = () => { if (state.renames.get(key) === form) state.renames.delete(key); };
    const save = button("Save", async () => {
        setStatus(status, "renaming…");
        try {
            const renamed = await apiJson(voiceUrl(voice.name), "PATCH", {name: input.value});
            say(`Renamed ${voice.name} to ${renamed.name}.`, "ok");
            close();
            await loadVoices();
        } catch (error) { failAt(status, error); }
    }, "primary");
    clearOnChange(status, [input]);
    const cancel = button("Cancel", () => { setStatus(status, ""); close(); renderVoices(); });  // not kept: put away
    input.addEventListener("keydown", (event) => {
        if (event.key === "Enter") save.click();
        if (event.key === "Escape") cancel.click();
    });
    const form = [input, " ", save, " ", cancel, status];
    state.renames.set(key, form);
    cell.replaceChildren(...form);
    input.focus();
    input.select();
}

function deleteQuestion(voice) {
    const isDefault = sameName(voice.name, state.defaultVoice);
    const removed = voice.source === "user" ? "It is removed from presets.toml"
        : "Its clip and transcript are removed from the voices folder (with any other file of that name)";
    const beneath = BENEATH[voice.shadows];
    if (beneath) {
        return `Delete your ${voice.source === "user" ? "preset" : "voice"} ${voice.name}? ${removed}, and the ` +
            `${beneath} ${voice.name} comes back in its place` + (isDefault ? ", as the default voice." : ".");
    }
    if (voice.source === "user") return `Delete the preset ${voice.name}? ${removed}.`;
    return `Delete the voice ${voice.name}? ${removed}` +
        (isDefault ? "; the server then picks another default voice." : ".");
}

async function deleteVoice(voice, status) {
    if (!confirm(deleteQuestion(voice))) return;
    setStatus(status, "deleting…");
    try {
        await api(voiceUrl(voice.name), {method: "DELETE"});
        const beneath = BENEATH[voice.shadows];
        say(beneath ? `Deleted your ${voice.name}: the ${beneath} ${voice.name} is back.` : `Deleted ${voice.name}.`, "ok");
        await loadVoices();
    } catch (error) { failAt(status, error); }
}

// --- playing samples ------------------------------------------------------------------------

// One voice plays at a time: a row's clip (the player) or greeting (speak), or the Try box's
// speech; each Play and Speak stops what plays. The row that plays is state.playing
// ({key: its name's, words: what its Play says, speech: the greeting's AbortController}),
// so that a redraw of the list gives its new Play the same words, and pressing it stops it.
const player = $("player");
player.addEventListener("ended", () => {
    window.studioStats.samplesEnded += 1;
    if (state.playing && !state.playing.speech) setPlaying(null);
});

function showPlaying() {
    for (const [key, node] of state.playButtons) {
        node.textContent = state.playing && state.playing.key === key ? state.playing.words : "▶ Play";
    }
}

function setPlaying(playing) {
    state.playing = playing;
    showPlaying();
}

function stopPlaying() {
    stopSpeaking();  // a greeting, or the Try box's speech
    player.pause();
    setPlaying(null);
}

// A new Play or Speak stops what plays, and the last speech's note ("done", "stopped"), which
// told of what played before, goes (not its error).
function playAnew() {
    stopPlaying();
    const last = state.speakLine;
    if (last && !last.classList.contains("error")) setStatus(last, "");
}

// Plays the clip at url for the row key; its note (while it loads) and its error are said in status, the row's line.
async function playBlob(url, key, status, note) {
    playAnew();
    const playing = {key: key, words: "… loading"};
    setPlaying(playing);
    setStatus(status, note || "");
    try {
        const blob = await (await api(url)).blob();
        if (state.playing !== playing) { setStatus(status, ""); return; }  // stopped, or another Play pressed
        setStatus(status, "");
        if (player.src) URL.revokeObjectURL(player.src);
        player.src = URL.createObjectURL(blob);
        playing.words = "■ Playing";
        showPlaying();
        await player.play();
    } catch (error) {
        if (state.playing === playing) setPlaying(null);
        failAt(status, error);
    }
}

function playSample(voice, status) {
    const key = nameKey(voice.name);
    if (state.playing && state.playing.key === key) {  // pressed again: it stops
        stopPlaying();
        return;
    }
    if (voice.served === "speaker" || voice.anchor === "off") {  // no clip: speak a greeting instead
        speak(voice.name, GREETINGS[voice.languages[0]] || GREETINGS.en, status, key);
        return;
    }
    const rendering = voice.kind === "voice_design" && voice.anchor !== "ready";
    const note = rendering ? "rendering its anchor first: this takes a moment…" : "";
    playBlob(voiceUrl(voice.name) + "/sample", key, status, note).then(() => {
        if (rendering) loadVoices();
    });
}

// --- streaming speech (Web Audio, 16-bit PCM as it arrives) ---------------------------------

let audioContext = null;

// Streams voiceName saying text; its notes and error are said in line: the Try box's status,
// or the line of the row whose Play speaks a greeting. One speech at a time (playAnew). Its
// "done" is a result: it goes when the next Play or Speak starts, or the Try box's text or
// voice changes (clearOnChange). key: the row whose greeting it is (its Play says so until
// the greeting ends), or none (the Try box). The speech is on (Stop offered,
// state.tryAbort its controller) until what arrived has played out, not merely arrived: the
// whole answer comes well before its last second is heard.
async function speak(voiceName, text, line, key) {
    playAnew();
    state.speakLine = line;
    const controller = new AbortController();
    state.tryAbort = controller;
    const playing = key === undefined ? null : {key: key, words: "… loading", speech: controller};
    setPlaying(playing);
    let unplayed = 0;  // sources scheduled that have not ended yet
    let received = false;  // the answer is all here, or failed
    let done = "";  // the note once it has played out (none after an error)
    const ended = () => {
        if (!received || unplayed) return;
        if (playing && state.playing === playing) setPlaying(null);
        if (state.tryAbort !== controller) return;  // stopped, or another speech on
        state.tryAbort = null;
        $("try-stop").disabled = true;
        if (done) setStatus(line, done, "ok");
    };
    $("try-stop").disabled = false;
    setStatus(line, "waiting for the first audio…");
    Object.assign(window.studioStats, {streamBytes: 0, streamChunks: 0, streamDone: false});
    if (!audioContext) audioContext = new AudioContext({sampleRate: SAMPLE_RATE});
    const context = audioContext;  // this speech's: Stop closes it (and forgets it) at any step
    let playAt = 0;
    let carry = null;
    try {
        await context.resume();
        playAt = context.currentTime + 0.1;
        const response = await api("v1/audio/speech", {
            method: "POST",
            headers: {"Content-Type": "application/json"},
            body: JSON.stringify({input: text, voice: voiceName, response_format: "pcm"}),
            signal: controller.signal,
        });
        const reader = response.body.getReader();
        for (;;) {
            const {done, value} = await reader.read();
            if (done) break;
            let bytes = value;
            if (carry) { bytes = new Uint8Array(carry.length + value.length); bytes.set(carry); bytes.set(value, carry.length); }
            const whole = bytes.length - (bytes.length % 2);
            carry = whole < bytes.length ? bytes.slice(whole) : null;
            if (!whole) continue;
            const pcm = new Int16Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + whole));
            const buffer = context.createBuffer(1, pcm.length, SAMPLE_RATE);
            const channel = buffer.getChannelData(0);
            for (let i = 0; i < pcm.length; i++) channel[i] = pcm[i] / 32768;
            const source = context.createBufferSource();
            source.buffer = buffer;
            source.connect(context.destination);
            playAt = Math.max(playAt, context.currentTime + 0.02);
            source.start(playAt);
            playAt += buffer.duration;
            unplayed += 1;
            source.addEventListener("ended", () => { unplayed -= 1; ended(); });
            if (playing && playing.words !== "■ Playing" && state.playing === playing) {
                playing.words = "■ Playing";
                showPlaying();
            }
            window.studioStats.streamBytes += whole;
            window.studioStats.streamChunks += 1;
            const seconds = window.studioStats.streamBytes / 2 / SAMPLE_RATE;
            line.textContent = `playing: ${seconds.toFixed(1)} s received`;
        }
        window.studioStats.streamDone = true;
        done = `done: ${(window.studioStats.streamBytes / 2 / SAMPLE_RATE).toFixed(1)} s`;
    } catch (error) {
        if (!controller.signal.aborted) failAt(line, error);  // stopped: stopSpeaking said so
    } finally {
        received = true;
        ended();  // now, or when the last source scheduled ends
    }
}

function stopSpeaking() {
    if (state.tryAbort) {
        state.tryAbort.abort();
        setStatus(state.speakLine, "stopped", "result");  // a result: it goes as "done" does
    }
    state.tryAbort = null;
    if (audioContext) { audioContext.close(); audioContext = null; }
    if (state.playing && state.playing.speech) setPlaying(null);
    $("try-stop").disabled = true;
}

$("try-speak").addEventListener("click", () => {
    const text = $("try-text").value.trim();
    if (!text) { setStatus($("try-status"), "Type something to say first.", "error"); return; }
    say("");
    speak($("try-voice").value, text, $("try-status"));
});
$("try-stop").addEventListener("click", stopSpeaking);
clearOnChange($("try-status"), [$("try-voice"), $("try-text")]);

// --- cloning: upload or record --------------------------------------------------------------

let recorder = null;

$("clone-file").addEventListener("change", () => {
    const file = $("clone-file").files[0];
    state.recorded = null;
    showPreview(file || null);
    if (file && !$("clone-name").value) {
        $("clone-name").value = file.name.replace(/\.[^.]*$/, "").replace(/[^\p{L}\p{N}_ .'-]/gu, "_").slice(0, 48);
    }
});

function showPreview(blob) {
    const preview = $("clone-preview");
    if (preview.src) URL.revokeObjectURL(preview.src);
    preview.hidden = !blob;
    preview.src = blob ? URL.createObjectURL(blob) : "";
}

if (!navigator.mediaDevices || !window.MediaRecorder) {
    $("clone-record").disabled = true;
    $("clone-record").title = "Recording needs HTTPS or localhost (Home Assistant's panel provides it)";
}

$("clone-record").addEventListener("click", async () => {
    const recordButton = $("clone-record");
    if (recorder) { recorder.stop(); return; }
    let stream;
    try {
        stream = await navigator.mediaDevices.getUserMedia({audio: true});
    } catch (error) {
        failAt($("clone-status"), new Error("The microphone is not available: " + error.message));
        return;
    }
    const chunks = [];
    recorder = new MediaRecorder(stream);
    recorder.addEventListener("dataavailable", (event) => chunks.push(event.data));
    recorder.addEventListener("stop", () => {
        stream.getTracks().forEach((track) => track.stop());
        state.recorded = new Blob(chunks, {type: recorder.mimeType || "audio/webm"});
        recorder = null;
        recordButton.textContent = "Record";
        recordButton.classList.remove("recording");
        $("clone-file").value = "";
        showPreview(state.recorded);
        setStatus($("clone-status"), "recorded: listen, then create the voice");
    });
    recorder.start();
    recordButton.textContent = "■ Stop recording";
    recordButton.classList.add("recording");
    setStatus($("clone-status"), "recording… read a sentence or two, then stop");
    setTimeout(() => { if (recorder) recorder.stop(); }, 20000);  // only 20 s are used
});

$("clone-create").addEventListener("click", async () => {
    const file = $("clone-file").files[0];
    const clip = file || state.recorded;
    if (!clip) { setStatus($("clone-status"), "Choose a clip or record one first.", "error"); return; }
    const form = new FormData();
    form.append("name", $("clone-name").value);
    form.append("transcript", $("clone-transcript").value);
    form.append("file", clip, file ? file.name : "recording.webm");
    const createButton = $("clone-create");
    createButton.disabled = true;
    setStatus($("clone-status"), "uploading…");
    try {
        const voice = await (await api("v1/audio/voices", {method: "POST", body: form})).json();
        say(`Created the clone voice ${voice.name}.`, "ok");
        setStatus($("clone-status"), `Created the clone voice ${voice.name}.`, "ok");
        $("clone-name").value = "";
        $("clone-transcript").value = "";
        $("clone-file").value = "";
        state.recorded = null;
        showPreview(null);
        await loadVoices();
    } catch (error) {
        failAt($("clone-status"), error);
    } finally {
        createButton.disabled = false;
    }
});
clearOnChange($("clone-status"), [$("clone-name"), $("clone-file"), $("clone-transcript")]);

// --- design ---------------------------------------------------------------------------------

$("design-run").addEventListener("click", async () => {
    const description = $("design-description").value.trim();
    if (!description) { setStatus($("design-status"), "Describe the voice first.", "error"); return; }
    const runButton = $("design-run");
    runButton.disabled = true;
    setStatus($("design-status"), "designing… each candidate is a few seconds of speech");
    $("candidates").replaceChildren();
    say("");
    try {
        const body = {description: description, language: $("design-language").value,
            count: Number($("design-count").value)};
        const text = $("design-text").value.trim();
        if (text) body.text = text;
        const result = await apiJson("v1/audio/designs", "POST", body);
        setStatus($("design-status"), `${result.candidates.length} candidate${result.candidates.length === 1 ? "" : "s"}`);
        result.candidates.forEach((candidate, index) => $("candidates").append(candidateCard(candidate, index, result)));
    } catch (error) {
        failAt($("design-status"), error);
    } finally {
        runButton.disabled = false;
    }
});
clearOnChange($("design-status"), [$("design-description"), $("design-text"), $("design-language"), $("design-count")]);

function candidateCard(candidate, index, design) {
    const audio = el("audio", {controls: true, preload: "auto"});
    const status = el("div", {className: "status candidate-status"});
    api(candidate.sample).then((r) => r.blob()).then((blob) => { audio.src = URL.createObjectURL(blob); })
        .catch((error) => failAt(status, error));
    const name = el("input", {type: "text", maxLength: 48, placeholder: "name for this voice"});
    const replaceButton = button("Replace", () => keep(true), "danger");
    replaceButton.hidden = true;
    async function keep(replace) {
        keepButton.disabled = true;
        replaceButton.hidden = true;
        setStatus(status, "keeping…");
        try {
            const body = {name: name.value, summary: design.description};
            if (replace) body.replace = true;
            const voice = await apiJson(`v1/audio/designs/${candidate.id}/keep`, "POST", body);
            say(`Kept candidate ${index + 1} as the preset ${voice.name}.`, "ok");
            setStatus(status, `Kept as the preset ${voice.name}.`, "ok");
            card.classList.add("kept");
            await loadVoices();
        } catch (error) {
            keepButton.disabled = false;
            // A shipped preset's name: the server says "replace": true overrides it; offer that.
            replaceButton.hidden = !(error.code === "name-taken" && /"replace": true/.test(error.message));
            replaceButton.title = `Keep it as your preset ${name.value}, spoken in place of the shipped one`;
            failAt(status, error);
        }
    }
    const keepButton = button("Keep", () => keep(false), "primary");
    const card = el("div", {className: "candidate"}, [
        el("h3", {textContent: `Candidate ${index + 1}`}),
        el("div", {className: "muted", textContent: `seed ${candidate.seed} · ${candidate.seconds.toFixed(1)} s`}),
        audio,
        el("div", {className: "row"}, [name, keepButton, replaceButton]),
        status,
    ]);
    clearOnChange(status, [name]);
    card.dataset.candidate = candidate.id;
    return card;
}

$("reload").addEventListener("click", loadVoices);
loadVoices();
