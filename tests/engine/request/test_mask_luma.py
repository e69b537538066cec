"""Issue 44: an inpaint gives sd-cli's pixels for any mask, anti-aliased or coloured edges included. sd-cli reads the
mask as one channel with stb_image's luma, (77 R + 150 G + 29 B) >> 8 (thirdparty/stb_image.h stbi__compute_y); the
bindings convert an RGB mask with Pillow's, 0.299 R + 0.587 G + 0.114 B rounded: off by one on many greys, which
moved pixels of the image (measured: a gradient mask, sd-cli's and accelstack's PNGs differed). The checked mask is
grey in sd-cli's luma, which Pillow's conversion then keeps exactly."""
from __future__ import annotations

from accelstack.engine.png import encode_png
from accelstack.engine.request.check import check_generation
from accelstack.engine.worker.protocol import GenerateRequest


def test_the_checked_mask_is_grey_in_stb_image_s_luma(probe_model, tmp_path):
    pixels = [(255, 255, 255), (0, 0, 0), (200, 30, 90), (128, 128, 128), (17, 240, 3)]
    rgb = bytes(v for _ in range(64 * 64 // len(pixels) + 1) for p in pixels for v in p)[:64 * 64 * 3]
    (tmp_path / "mask.png").write_bytes(encode_png(64, 64, rgb))
    (tmp_path / "init.png").write_bytes(encode_png(64, 64, bytes(64 * 64 * 3)))
    checked = check_generation(GenerateRequest(prompt="x", width=64, height=64, steps=1, init_image=str(tmp_path / "init.png"),
                                               mask_image=str(tmp_path / "mask.png")), probe_model.path, tmp_path / "o.png")
    mask = checked.components.mask_rgb
    for i, (r, g, b) in enumerate(pixels):
        y = (77 * r + 150 * g + 29 * b) >> 8
        assert mask[3 * i:3 * i + 3] == bytes((y, y, y)), (r, g, b)
