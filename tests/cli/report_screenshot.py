"""Helpers for tests of `runner report`: a headless-Chromium screenshot of an HTML file, and pixel counts by colour."""
import os
import pathlib
import shutil
import subprocess
import tempfile


def chromium_binary():
    """The path of Debian's `chromium` on PATH, or None when it is not installed."""
    return shutil.which("chromium")


def screenshot(html_path, png_path, width=1280, height=900):
    """Renders html_path with headless Chromium into a width x height PNG at png_path; returns png_path.

    Raises FileNotFoundError when chromium is not on PATH, RuntimeError when it fails or writes no image, and
    subprocess.TimeoutExpired after 120 s.
    """
    binary = chromium_binary()
    if binary is None:
        raise FileNotFoundError("chromium is not on PATH (apt-get install chromium)")
    html_uri = pathlib.Path(html_path).resolve().as_uri()
    png_path = pathlib.Path(png_path).resolve()
    if png_path.exists():
        png_path.unlink()
    with tempfile.TemporaryDirectory(prefix="runner-chromium-") as profile:
        command = [
            binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--no-first-run", "--no-default-browser-check", "--disable-extensions",
            f"--user-data-dir={profile}", f"--screenshot={png_path}", f"--window-size={width},{height}", html_uri,
        ]
        # HOME inside the profile keeps crash-reporter and font-cache files out of the real home directory.
        result = subprocess.run(command, capture_output=True, text=True, timeout=120,
                                env={**os.environ, "HOME": profile}, cwd=profile)
    if result.returncode != 0 or not png_path.is_file():
        raise RuntimeError(f"chromium screenshot of {html_path} failed (exit {result.returncode}):\n{result.stderr}")
    return str(png_path)


def count_colour(png_path, rgb, tolerance=40):
    """The number of pixels whose R, G and B each lie within tolerance of rgb, given as (r, g, b) or "#rrggbb"."""
    from PIL import Image, ImageChops

    if isinstance(rgb, str):
        text = rgb.lstrip("#")
        rgb = tuple(int(text[i:i + 2], 16) for i in (0, 2, 4))
    with Image.open(png_path) as image:
        bands = image.convert("RGB").split()
    # Per channel 255 where it is close enough, else 0; multiplying the three keeps 255 where all are.
    masks = [band.point([255 if abs(v - target) <= tolerance else 0 for v in range(256)])
             for band, target in zip(bands, rgb)]
    close = ImageChops.multiply(ImageChops.multiply(masks[0], masks[1]), masks[2])
    return close.histogram()[255]
