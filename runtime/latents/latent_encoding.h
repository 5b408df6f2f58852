// `runner data encode`: images (a folder, or a packed uint8 .npy) into VAE posteriors for data.latents,
// in batches on the chosen device, resumable after an interruption or a crash.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace runner::latents {

struct EncodeOptions {
  std::string vae;    // a diffusers VAE folder or a safetensors file (nn::load_autoencoder_kl)
  int size = 0;       // image folders: shorter side resized to this, center crop size x size (required);
                      // a packed .npy: its side, checked when given
  bool flip = false;  // also encode the horizontal flip of every image
  std::int64_t batch = 32;
  int workers = -1;  // decoding threads (-1: the loader's default)
  std::string device = "auto";
  // Called after every batch with the images encoded so far (resumed ones included).
  std::function<void(std::int64_t done, std::int64_t total)> progress;
};

struct EncodeResult {
  std::int64_t images = 0;
  std::int64_t resumed_from = 0;  // images already encoded by an interrupted earlier run (0: a fresh start)
  std::string manifest_path;
  std::string labels_path;  // empty when unlabelled
  std::string classes_path;
};

// Writes out_path (float32 [N, F, 2, C, h, w]: per image and flip, the posterior mean and log-variance), its
// manifest <stem>.json (source, preprocessing, the VAE's weights file, sha256 and scaling factor), and labels
// beside it as `runner data pack` does. Until the end the array is <out>.partial with progress in
// <out>.progress.json; the same command continues it. Throws core::Interrupted on Ctrl-C after saving progress.
EncodeResult encode_latents(const std::string& source, const std::string& out_path, const EncodeOptions& options);

}  // namespace runner::latents
