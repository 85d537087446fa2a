"""The dataset tool: walk a folder's images and clips, edit their captions, and paint the images' training masks.

Captions are saved as `<stem>.txt` (Enter), masks as `<stem>-masklabel.png` after every stroke; both atomically.
A clip shows a frame at a time (its first, then Left / Right or the frame buttons); masks are not painted on clips.
The painting itself (strokes, fill, undo, saving) is `gui.mask_editing.MaskDocument`; this window maps pointer
events on the canvas to image pixels and shows the result.
"""

from __future__ import annotations

import tkinter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import customtkinter as ctk
from PIL import ImageTk, UnidentifiedImageError

from gui.concept_preview import ClipFrames, clip_facts
from gui.mask_editing import IGNORE, TRAIN, MaskDocument
from gui.widgets.bar_chart import themed
from gui.widgets.clip_player import ClipPlayer
from gui.widgets.pictures import fit_size, fitted, set_picture
from gui.window_position import place_over
from onetrainer.data.images import list_images, open_rgb, read_text, reference_paths_of
from onetrainer.data.video import UnreadableClip, is_clip, list_clips
from onetrainer.util.fs import atomic_write_text

if TYPE_CHECKING:
    from gui.dialogs import Dialogs

CANVAS_SIZE = (760, 560)
CANVAS_BACKGROUND = ("gray80", "gray12")
MUTED_TEXT = ("gray40", "gray60")
BRUSH_SIZES = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)  # radius in screen pixels
DEFAULT_BRUSH = 16
REFERENCE_THUMBNAILS = 4  # reference images shown under the caption (an edit model's inputs)
THUMBNAIL_BOX = (64, 64)
HELP = (
    "Left drag: paint (train) · Right drag: erase · Wheel or [ ]: brush size · F: fill tool, B: brush · "
    "M: mask only · Ctrl+Z: undo · Up/Down: previous/next image · Left/Right: a clip's previous/next frame · "
    "Enter: save caption (Shift+Enter: new line)"
)
NO_MASKS_ON_CLIPS = "masks are not painted on clips"


class DatasetToolWindow(ctk.CTkToplevel):
    def __init__(self, master: Any, dialogs: Dialogs | None = None, folder: str | Path | None = None) -> None:
        super().__init__(master)
        self.dialogs = dialogs
        self.title("Dataset tool")
        place_over(self, master, (1180, 820))
        self.minsize(900, 600)
        self.folder: Path | None = None
        self.images: list[Path] = []
        self.position = -1
        self.document: MaskDocument | None = None
        self.clip: ClipFrames | None = None  # the clip shown (None: an image, or an unreadable clip)
        self.loaded_caption = ""
        self.tool = "brush"
        self.brush = DEFAULT_BRUSH
        self.mask_only = False
        self.scale = 1.0
        self.offset = (0, 0)
        self._photo: ImageTk.PhotoImage | None = None
        self._button_value = TRAIN

        self.grid_columnconfigure(1, weight=1)
        self.grid_rowconfigure(1, weight=1)
        self._build_toolbar()
        self._build_list()
        self._build_canvas()
        self._build_caption()
        self._bind_keys()
        self.protocol("WM_DELETE_WINDOW", self.close)
        if folder is not None:
            self.open_folder(folder)
        else:
            self._show_status("Open a folder of images to caption and mask.")

    # -- layout --------------------------------------------------------------------------------------------------

    def _build_toolbar(self) -> None:
        bar = ctk.CTkFrame(self, fg_color="transparent")
        bar.grid(row=0, column=0, columnspan=2, sticky="ew", padx=10, pady=(10, 4))
        ctk.CTkButton(bar, text="Open folder…", width=120, command=self.choose_folder).pack(side="left")
        self.folder_label = ctk.CTkLabel(bar, text="", anchor="w", text_color=MUTED_TEXT, width=300)
        self.folder_label.pack(side="left", padx=10)
        # The painting tools, shown for an image; a clip shows its frame steps in their place.
        self.paint_bar = paint = ctk.CTkFrame(bar, fg_color="transparent")
        paint.pack(side="right")
        self.undo_button = ctk.CTkButton(paint, text="Undo", width=70, command=self.undo)
        self.undo_button.pack(side="right")
        self.mask_only_switch = ctk.CTkSwitch(paint, text="Mask only", command=self._mask_only_toggled)
        self.mask_only_switch.pack(side="right", padx=12)
        self.brush_label = ctk.CTkLabel(paint, text="", width=110)
        self.brush_label.pack(side="right", padx=6)
        self.tool_buttons = ctk.CTkSegmentedButton(paint, values=["Brush", "Fill"], command=self._tool_chosen)
        self.tool_buttons.set("Brush")
        self.tool_buttons.pack(side="right", padx=6)
        self._show_brush()
        self.clip_bar = ctk.CTkFrame(bar, fg_color="transparent")
        self.clip_note = ctk.CTkLabel(self.clip_bar, text=NO_MASKS_ON_CLIPS.capitalize(), text_color=MUTED_TEXT)
        self.clip_note.pack(side="left", padx=(0, 6))
        # the app's one clip widget (frame steps, play / pause, the rate), its frames drawn on the canvas
        self.player = ClipPlayer(self.clip_bar, CANVAS_SIZE, autoplay=False, display=self.render)
        self.player.pack(side="left")
        self.previous_frame_button = self.player.back_button
        self.next_frame_button = self.player.forward_button
        self.frame_label = self.player.frame_label

    def _show_bar(self, clip: bool) -> None:
        """The frame steps for a clip, the painting tools for an image."""
        shown, hidden = (self.clip_bar, self.paint_bar) if clip else (self.paint_bar, self.clip_bar)
        hidden.pack_forget()
        shown.pack(side="right")

    def _build_list(self) -> None:
        frame = ctk.CTkFrame(self)
        frame.grid(row=1, column=0, sticky="ns", padx=(10, 4), pady=4)
        frame.grid_rowconfigure(0, weight=1)
        self.listbox = tkinter.Listbox(
            frame,
            width=28,
            activestyle="none",
            exportselection=False,
            borderwidth=0,
            highlightthickness=0,
            background=themed(("gray90", "gray17")),
            foreground=themed(("gray10", "#DCE4EE")),
            selectbackground=themed(("#3a7ebf", "#1f538d")),
            selectforeground="white",
        )
        self.listbox.grid(row=0, column=0, sticky="ns", padx=6, pady=6)
        scrollbar = ctk.CTkScrollbar(frame, command=self.listbox.yview)
        scrollbar.grid(row=0, column=1, sticky="ns", pady=6)
        self.listbox.configure(yscrollcommand=scrollbar.set)
        self.listbox.bind("<<ListboxSelect>>", self._list_selected)
        for key, delta in (("<Up>", -1), ("<Down>", 1)):
            self.listbox.bind(key, lambda _e, d=delta: (self._step(d), "break")[1])

    def _build_canvas(self) -> None:
        self.canvas = tkinter.Canvas(
            self,
            width=CANVAS_SIZE[0],
            height=CANVAS_SIZE[1],
            highlightthickness=0,
            background=themed(CANVAS_BACKGROUND),
            cursor="crosshair",
        )
        self.canvas.grid(row=1, column=1, sticky="nsew", padx=(4, 10), pady=4)
        canvas = self.canvas
        for button, value in ((1, TRAIN), (3, IGNORE)):
            canvas.bind(f"<ButtonPress-{button}>", lambda e, v=value: self._press(e, v))
            canvas.bind(f"<B{button}-Motion>", self._drag)
            canvas.bind(f"<ButtonRelease-{button}>", self._release)
        canvas.bind("<Motion>", self._hover)
        canvas.bind("<Leave>", lambda _e: canvas.delete("brush"))
        canvas.bind("<MouseWheel>", lambda e: self.change_brush(1 if e.delta > 0 else -1))
        canvas.bind("<Button-4>", lambda _e: self.change_brush(1))  # X11 wheel
        canvas.bind("<Button-5>", lambda _e: self.change_brush(-1))
        canvas.bind("<Configure>", lambda _e: self.render())

    def _build_caption(self) -> None:
        frame = ctk.CTkFrame(self, fg_color="transparent")
        frame.grid(row=2, column=0, columnspan=2, sticky="ew", padx=10, pady=(4, 0))
        frame.grid_columnconfigure(1, weight=1)
        self.caption_label = ctk.CTkLabel(frame, text="Caption", anchor="w", width=110)
        self.caption_label.grid(row=0, column=0, sticky="nw", pady=4)
        self.caption = ctk.CTkTextbox(frame, height=64, wrap="word", undo=True)
        self.caption.grid(row=0, column=1, sticky="ew", padx=6)
        self.save_caption_button = ctk.CTkButton(frame, text="Save caption", width=110, command=self.save_caption)
        self.save_caption_button.grid(row=0, column=2, sticky="n")
        self.caption.bind("<Return>", lambda _e: (self.save_caption(), "break")[1])
        self.caption.bind("<Shift-Return>", lambda _e: None)  # more specific than <Return>: inserts a new line
        for key, delta in (("<Up>", -1), ("<Down>", 1)):
            self.caption.bind(key, lambda _e, d=delta: (self._step(d), "break")[1])
        self.help = ctk.CTkLabel(self, text=HELP, text_color=MUTED_TEXT, anchor="w", justify="left", wraplength=1100)
        self.help.grid(row=3, column=0, columnspan=2, sticky="ew", padx=12, pady=(2, 0))
        self.status = ctk.CTkLabel(self, text="", anchor="w")
        self.status.grid(row=4, column=0, columnspan=2, sticky="ew", padx=12, pady=(0, 8))
        # An edit model's reference images of the shown image (`<name>-reference[-N].<ext>`), small, in order.
        strip = self.reference_strip = ctk.CTkFrame(self, fg_color="transparent")
        strip.grid(row=6, column=0, columnspan=2, sticky="ew", padx=12, pady=(0, 8))  # below the auto tools (row 5)
        strip.grid_remove()  # shown for an image with references only
        self.reference_label = ctk.CTkLabel(strip, text="", anchor="w", text_color=MUTED_TEXT, width=110)
        self.reference_label.grid(row=0, column=0, sticky="nw")
        self.reference_pictures = [
            ctk.CTkLabel(strip, text="", width=THUMBNAIL_BOX[0], height=THUMBNAIL_BOX[1])
            for _ in range(REFERENCE_THUMBNAILS)
        ]
        for column, picture in enumerate(self.reference_pictures, start=1):
            picture.grid(row=0, column=column, sticky="nw", padx=(0, 6))
        self.references: tuple[Path, ...] = ()

    def _bind_keys(self) -> None:
        for key, delta in (("<Up>", -1), ("<Down>", 1)):
            self.bind(key, lambda e, d=delta: self._outside_text(e) and self._step(d))
        self.bind("<Control-z>", lambda e: self._outside_text(e) and self.undo())
        for key, delta in (("<Left>", -1), ("<Right>", 1)):
            self.bind(key, lambda e, d=delta: self._outside_text(e) and self.step_frame(d))
        for key, action in (
            ("f", lambda: self.set_tool("fill")),
            ("b", lambda: self.set_tool("brush")),
            ("m", self.toggle_mask_only),
            ("bracketleft", lambda: self.change_brush(-1)),
            ("bracketright", lambda: self.change_brush(1)),
        ):
            self.bind(f"<KeyPress-{key}>", lambda e, a=action: self._outside_text(e) and a())

    @staticmethod
    def _outside_text(event: Any) -> bool:
        """Shortcuts are letters: typed into the caption they are text, not commands."""
        return not isinstance(event.widget, tkinter.Text | tkinter.Entry)

    def close(self) -> None:
        """Closing keeps an edited caption, as moving to another image does."""
        self._keep_caption()
        self.destroy()

    # -- images ----------------------------------------------------------------------------------------------------

    def choose_folder(self) -> None:
        folder = self.dialogs.open_dir("Open a folder of images and clips") if self.dialogs is not None else ""
        if folder:
            self.open_folder(folder)

    def open_folder(self, folder: str | Path) -> None:
        self._keep_caption()
        self.folder = Path(folder)
        self.images = sorted(list_images(self.folder) + list_clips(self.folder)) if self.folder.is_dir() else []
        self.folder_label.configure(text=str(self.folder))
        self.listbox.delete(0, "end")
        for path in self.images:
            self.listbox.insert("end", path.name)
        self.position = -1
        self.document = None
        self.clip = None
        self.player.clear()
        self._show_bar(clip=False)
        if self.images:
            self.show_image(0)
        else:
            self.render()
            self._show_status(f"No images or clips in {self.folder}.")

    def show_image(self, index: int) -> None:
        if not self.images:
            return
        self._keep_caption()
        index = max(0, min(len(self.images) - 1, index))
        self.position = index
        path = self.images[index]
        self.listbox.selection_clear(0, "end")
        self.listbox.selection_set(index)
        self.listbox.see(index)
        self.document, self.clip = None, None
        self.player.clear()  # a clip playing stops
        if is_clip(path):
            self._open_clip(path)
        else:
            self._show_bar(clip=False)
            try:
                self.document = MaskDocument(path)
            except (OSError, UnidentifiedImageError) as e:
                self._show_status(f"Cannot read {path.name}: {e}")
            else:
                self._show_status(
                    f"{path.name}: {'mask found' if self.document.has_mask else 'no mask (trains whole)'}"
                )
        self._load_caption(path)
        self._show_references(path)
        self.render()

    def _open_clip(self, path: Path) -> None:
        """Show a clip from its first frame, with its frame steps; its caption is edited as an image's."""
        self._show_bar(clip=True)
        try:
            self.clip = ClipFrames(path)
        except UnreadableClip as e:
            self.player.clear()
            self.frame_label.configure(text="unreadable clip")
            self._show_status(f"Cannot read {path.name}: {e} (a run names it and skips it)")
            return
        self.player.show_source(self.clip)
        self._show_status(f"{path.name}: a clip, {clip_facts(self.clip.header)}; {NO_MASKS_ON_CLIPS}")

    def step_frame(self, delta: int) -> None:
        """Show a clip's frame `delta` frames on (round its ends); nothing for an image."""
        if self.clip is None:
            return
        self.player.step(delta)

    def _show_references(self, image: Path) -> None:
        """The image's reference images, the first few as pictures; none shown for an image without any."""
        self.references = reference_paths_of(image)
        count = len(self.references)
        self.reference_label.configure(text=f"References: {count}" if count else "")
        if count:
            self.reference_strip.grid()
        else:
            self.reference_strip.grid_remove()
        for index, picture in enumerate(self.reference_pictures):
            if index < count:
                try:
                    set_picture(picture, fitted(open_rgb(self.references[index]), THUMBNAIL_BOX))
                except (OSError, UnidentifiedImageError):
                    set_picture(picture, None, self.references[index].name)
            else:
                set_picture(picture, None)

    def _step(self, delta: int) -> None:
        self.show_image(self.position + delta)

    def _list_selected(self, _event: Any = None) -> None:
        selection = self.listbox.curselection()
        if selection and selection[0] != self.position:
            self.show_image(selection[0])

    # -- captions ----------------------------------------------------------------------------------------------

    def caption_path(self) -> Path | None:
        return self.images[self.position].with_suffix(".txt") if self.position >= 0 else None

    def _load_caption(self, image: Path) -> None:
        path = image.with_suffix(".txt")
        self.loaded_caption = read_text(path).strip() if path.is_file() else ""
        self.caption.delete("1.0", "end")
        self.caption.insert("1.0", self.loaded_caption)
        self.caption.edit_reset()
        self.caption_label.configure(text=f"Caption\n({path.name})")

    def caption_text(self) -> str:
        return self.caption.get("1.0", "end").strip()

    def save_caption(self) -> Path | None:
        path = self.caption_path()
        if path is None:
            return None
        text = self.caption_text()
        if not text and not path.exists():
            return None  # nothing typed, nothing to keep
        atomic_write_text(path, text + "\n")
        self.loaded_caption = text
        self._show_status(f"Caption saved: {path.name}")
        return path

    def _keep_caption(self) -> None:
        """Leaving an image saves its edited caption (typing is easily lost otherwise)."""
        if self.position >= 0 and self.caption_text() != self.loaded_caption:
            self.save_caption()

    # -- painting ----------------------------------------------------------------------------------------------

    def set_tool(self, tool: str) -> None:
        self.tool = tool
        self.tool_buttons.set(tool.capitalize())

    def _tool_chosen(self, label: str) -> None:
        self.tool = label.lower()

    def toggle_mask_only(self) -> None:
        self.mask_only = not self.mask_only
        if self.mask_only:
            self.mask_only_switch.select()
        else:
            self.mask_only_switch.deselect()
        self.render()

    def _mask_only_toggled(self) -> None:
        self.mask_only = bool(self.mask_only_switch.get())
        self.render()

    def change_brush(self, steps: int) -> None:
        index = min(range(len(BRUSH_SIZES)), key=lambda i: abs(BRUSH_SIZES[i] - self.brush))
        self.brush = BRUSH_SIZES[max(0, min(len(BRUSH_SIZES) - 1, index + steps))]
        self._show_brush()

    def _show_brush(self) -> None:
        self.brush_label.configure(text=f"brush {self.brush} px")

    def to_image(self, x: float, y: float) -> tuple[float, float]:
        """Canvas coordinates → image pixel coordinates."""
        return (x - self.offset[0]) / self.scale, (y - self.offset[1]) / self.scale

    def _press(self, event: Any, value: int) -> None:
        self.canvas.focus_set()  # the shortcuts then reach the window, not the caption
        if self.clip is not None:
            self._show_status(f"{self.clip.path.name}: {NO_MASKS_ON_CLIPS}; its caption is edited below")
        if self.document is None:
            return
        self._button_value = value
        x, y = self.to_image(event.x, event.y)
        if self.tool == "fill":
            self.document.fill(x, y, value)
        else:
            self.document.stroke_start(x, y, self.brush / self.scale, value)
        self.render()

    def _drag(self, event: Any) -> None:
        if self.document is None or self.tool == "fill":
            return
        x, y = self.to_image(event.x, event.y)
        self.document.stroke_to(x, y, self.brush / self.scale, self._button_value)
        self.render()
        self._hover(event)

    def _release(self, _event: Any) -> None:
        if self.document is None:
            return
        self.document.stroke_end()
        self._save_mask()

    def undo(self) -> None:
        if self.document is not None and self.document.undo():
            self._save_mask()
            self.render()

    def _save_mask(self) -> None:
        assert self.document is not None
        try:
            saved = self.document.save()
        except OSError as e:
            self._show_status(f"Cannot save the mask: {e}")
            return
        self._show_status(f"Mask saved: {saved.name}" if saved else "Mask removed (the whole image trains).")

    def _hover(self, event: Any) -> None:
        self.canvas.delete("brush")
        if self.document is not None and self.tool == "brush":
            r = self.brush
            self.canvas.create_oval(
                event.x - r, event.y - r, event.x + r, event.y + r, outline="#ff9f1c", width=1, tags="brush"
            )

    # -- drawing -------------------------------------------------------------------------------------------------

    def render(self) -> None:
        self.canvas.delete("picture")
        if self.clip is not None:
            try:
                picture = self.clip.frame()
            except UnreadableClip as e:
                self._show_status(f"{self.clip.path.name}: cannot decode frame {self.clip.position + 1}: {e}")
                return
        elif self.document is not None:
            picture = None
        else:
            return
        size = picture.size if picture is not None else self.document.size
        width = self.canvas.winfo_width() if self.canvas.winfo_width() > 1 else CANVAS_SIZE[0]
        height = self.canvas.winfo_height() if self.canvas.winfo_height() > 1 else CANVAS_SIZE[1]
        shown = fit_size(size, (width, height))
        self.scale = shown[0] / size[0]
        self.offset = ((width - shown[0]) // 2, (height - shown[1]) // 2)
        if picture is not None:
            shown_picture = picture.resize(shown)
        else:
            shown_picture = self.document.composite(shown, self.mask_only)
        self._photo = ImageTk.PhotoImage(shown_picture, master=self.canvas)
        self.canvas.create_image(*self.offset, image=self._photo, anchor="nw", tags="picture")
        self.canvas.tag_lower("picture")

    def _show_status(self, text: str) -> None:
        self.status.configure(text=text)
