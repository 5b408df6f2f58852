"""torch.save files written by Python torch (zip and legacy formats): torch.load and module:load read them without
running code; other Python objects and unfitting state dicts are refused with errors that name the file and line."""
import argparse
import collections
import os

import torch
from safetensors.torch import load_file, save_file

from runner_process import RunnerHomeTest


class MakesAFile:
    """Unpickling this would run os.system: it must be refused by class name, never called."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class TorchFiles(RunnerHomeTest):
    def test_values_of_a_pt_file_become_lua_values(self):
        tensors = {"a": torch.randn(3, 4), "b": torch.arange(6, dtype=torch.int64).reshape(2, 3),
                   "h": torch.randn(5).to(torch.bfloat16)}
        torch.save({"model": collections.OrderedDict(w=tensors["a"], counts=tensors["b"]), "half": tensors["h"],
                    "step": 1200, "lr": 2.5e-4, "name": "DiT-XL/2", "flags": [True, None, 3], "pair": (7, "x"),
                    "view": tensors["a"][1:, 2:]}, self.dir / "mixed.pt")
        self.script("read.lua", """
            local value, meta = torch.load("mixed.pt")
            assert(meta.format == "pytorch", meta.format)
            assert(value.step == 1200 and value.lr == 2.5e-4 and value.name == "DiT-XL/2")
            assert(value.flags[1] == true and value.flags[2] == nil and value.flags[3] == 3)
            assert(value.pair[1] == 7 and value.pair[2] == "x")
            torch.save({ w = value.model.w, counts = value.model.counts, half = value.half, view = value.view:contiguous() },
                       "back.safetensors")
        """)
        self.runner("read.lua", check=0)
        back = load_file(self.dir / "back.safetensors")
        self.assertTrue(torch.equal(back["w"], tensors["a"]))
        self.assertTrue(torch.equal(back["counts"], tensors["b"]))
        self.assertEqual(back["half"].dtype, torch.bfloat16)
        self.assertTrue(torch.equal(back["half"], tensors["h"]))
        self.assertTrue(torch.equal(back["view"], tensors["a"][1:, 2:]), "a view keeps its offset and strides")

    def test_module_load_of_a_state_dict_and_of_one_entry_of_a_checkpoint(self):
        self.script("save.lua", """
            local model = nn.UNet { channels = 8, mults = { 1 }, blocks = 1, attention = {}, image = 8, groups = 4 }
            model:save("initial.safetensors")
        """)
        self.runner("save.lua", check=0)
        state = load_file(self.dir / "initial.safetensors")
        trained = {name: value + 0.5 for name, value in state.items()}
        torch.save(trained, self.dir / "weights.pt")
        torch.save({"model": state, "ema": trained, "opt": {"state": {}, "param_groups": [{"lr": 1e-4}]}, "epoch": 3},
                   self.dir / "checkpoint.pth")
        self.script("load.lua", """
            local function make() return nn.UNet { channels = 8, mults = { 1 }, blocks = 1, attention = {}, image = 8, groups = 4 } end
            local plain, ema = make(), make()
            plain:load("weights.pt")
            ema:load("checkpoint.pth", { key = "ema" })
            plain:save("plain.safetensors")
            ema:save("ema.safetensors")
            local ok, message = pcall(make().load, make(), "checkpoint.pth")
            print(message)
        """)
        result = self.runner("load.lua", check=0)
        for name in ("plain", "ema"):
            loaded = load_file(self.dir / f"{name}.safetensors")
            for key, value in trained.items():
                self.assertTrue(torch.equal(loaded[key], value), f"{name}: {key}")
        self.assertIn('checkpoint.pth holds several entries (ema, model, opt): choose one with { key = "ema" }',
                      result.stdout)

    def test_a_mismatch_names_the_scripts_line(self):
        torch.save({"weight": torch.zeros(3, 3)}, self.dir / "other.pt")
        self.script("mismatch.lua", """
            local layer = nn.Linear(4, 2)

            layer:load("other.pt")
        """)
        result = self.runner("mismatch.lua", check=1)
        self.assertIn("mismatch.lua:3: load_state_dict: missing keys: bias; shape mismatch for weight: state has [3, 3], "
                      "module has [2, 4]", result.stderr)
        self.script("no_entry.lua", """
            torch.save({}, "unused.safetensors")
            nn.Linear(4, 2):load("other.pt", { key = "ema" })
        """)
        result = self.runner("no_entry.lua", check=1)
        self.assertIn("no_entry.lua:2: load: other.pt has no entry 'ema'", result.stderr)

    def test_other_python_objects_are_refused_without_running_them(self):
        marker = self.dir / "ran"
        torch.save({"model": {"w": torch.ones(2)}, "run": MakesAFile(marker)}, self.dir / "evil.pt")
        torch.save({"model": {"w": torch.ones(2)}, "args": argparse.Namespace(run=MakesAFile(marker))}, self.dir / "training.pt")
        self.script("evil.lua", 'torch.load(arg[1])')
        result = self.runner("evil.lua", "--", "evil.pt", check=1)
        self.assertFalse(marker.exists(), "unpickling ran code")
        self.assertRegex(result.stderr, r"evil\.pt: holds a Python object of class (posix|os)\.system; runner reads files of "
                                        r"tensors, dicts, lists, tuples, numbers, strings and argparse\.Namespace only")
        result = self.runner("evil.lua", "--", "training.pt", check=1)
        self.assertFalse(marker.exists(), "unpickling ran code")
        self.assertRegex(result.stderr, r"evil\.lua:1: training\.pt: holds a Python object of class (posix|os)\.system")

    def test_a_checkpoint_of_the_official_dit_train_py_loads_and_shows_its_args(self):
        # DiT's train.py saves {"model", "ema", "opt", "args"}, args being its argparse.Namespace.
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        ema = torch.nn.Linear(4, 2)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0)
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        args = argparse.Namespace(data_path="/data/imagenet/train", results_dir="results", model="DiT-XL/2",
                                  image_size=256, num_classes=1000, epochs=1400, global_batch_size=256, global_seed=0,
                                  vae="ema", num_workers=4, log_every=100, ckpt_every=50_000)
        torch.save({"model": model.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(), "args": args},
                   self.dir / "0050000.pt")
        self.script("load.lua", """
            local ema = nn.Linear(4, 2)
            ema:load("0050000.pt", { key = "ema" })
            ema:save("ema.safetensors")
            local checkpoint = torch.load("0050000.pt")
            print(checkpoint.args.model, checkpoint.args.image_size, checkpoint.opt.param_groups[1].lr)
        """)
        result = self.runner("load.lua", check=0)
        self.assertEqual(result.stdout, "DiT-XL/2\t256\t0.0001\n")
        loaded = load_file(self.dir / "ema.safetensors")
        for name, value in ema.state_dict().items():
            self.assertTrue(torch.equal(loaded[name], value), name)

    def test_the_legacy_format_is_read_and_damaged_files_say_what_they_are(self):
        # PyTorch before 1.6 wrote pickles and raw storages one after the other (pytorch-fid's weights are such a file).
        weights = torch.randn(4, 5)
        torch.save({"w": weights, "view": weights[1:3, 2:], "count": 7}, self.dir / "legacy.pt",
                   _use_new_zipfile_serialization=False)
        good = self.dir / "good.pt"
        torch.save({"w": torch.ones(1000)}, good)
        (self.dir / "cut.pt").write_bytes(good.read_bytes()[:300])
        (self.dir / "cut_legacy.pt").write_bytes((self.dir / "legacy.pt").read_bytes()[:-10])
        self.script("load.lua", """
            local value = torch.load(arg[1])
            torch.save({ w = value.w, view = value.view:contiguous() }, "out.safetensors")
            print("count", value.count)
        """)
        result = self.runner("load.lua", "--", "legacy.pt", check=0)
        self.assertIn("count\t7", result.stdout)
        loaded = load_file(self.dir / "out.safetensors")
        self.assertTrue(torch.equal(loaded["w"], weights))
        self.assertTrue(torch.equal(loaded["view"], weights[1:3, 2:]))
        result = self.runner("load.lua", "--", "cut.pt", check=1)
        self.assertIn("cut.pt: cannot read this torch.save file: ", result.stderr)
        self.assertNotIn("Exception raised from", result.stderr, "LibTorch's C++ stack is not shown")
        result = self.runner("load.lua", "--", "cut_legacy.pt", check=1)
        self.assertIn("cut_legacy.pt: cannot read this torch.save file: the pickle ends early (the file is damaged)",
                      result.stderr)
